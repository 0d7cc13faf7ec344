//! What a running move shows: progress bars on a terminal, plain lines otherwise (stderr).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::BoxFuture;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use shard_directory_mover::{Observer, Phase};

/// Progress bars on a terminal, plain lines otherwise: one per phase, per finished table, per
/// change of the replication lag (at most one a second).
pub struct Progress {
    bars: Option<MultiProgress>,
    /// A bar per table of each move (a plan runs several at once).
    tables: Mutex<HashMap<(i64, String), ProgressBar>>,
    lag_shown: Mutex<Option<(Instant, i64)>>,
    /// The move this process runs, once it has an id.
    move_id: Mutex<Option<i64>>,
    /// Its phase, as last reported.
    phase: Mutex<Option<Phase>>,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            bars: std::io::stderr().is_terminal().then(MultiProgress::new),
            tables: Mutex::default(),
            lag_shown: Mutex::default(),
            move_id: Mutex::default(),
            phase: Mutex::default(),
        }
    }

    pub fn line(&self, message: &str) {
        let stamp = humantime::format_rfc3339_millis(SystemTime::now());
        match &self.bars {
            Some(bars) => {
                let _ = bars.println(message);
            }
            None => eprintln!("{stamp} {message}"),
        }
    }

    pub fn move_id(&self) -> Option<i64> {
        *self.move_id.lock().expect("progress lock")
    }
}

impl Observer for Progress {
    fn phase(&self, move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        *self.move_id.lock().expect("progress lock") = Some(move_id);
        *self.phase.lock().expect("progress lock") = Some(phase);
        self.line(&format!("move {move_id}: {phase}"));
        Box::pin(std::future::ready(()))
    }

    fn rows(&self, move_id: i64, table: &str, done: i64, total: i64) {
        let Some(bars) = &self.bars else {
            if done == total {
                self.line(&format!("move {move_id}: {table}: {done}/{total} rows"));
            }
            return;
        };
        let mut tables = self.tables.lock().expect("progress lock");
        let bar = tables
            .entry((move_id, table.to_owned()))
            .or_insert_with(|| {
                let bar = bars.add(ProgressBar::new(total.max(0) as u64));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix:>24} [{bar:30}] {pos}/{len} rows, {per_sec}, eta {eta}",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                );
                bar.set_prefix(format!("{move_id} {table}"));
                bar
            });
        bar.set_length(total.max(done).max(0) as u64);
        bar.set_position(done.max(0) as u64);
    }

    fn lag(&self, move_id: i64, bytes: i64) {
        let mut shown = self.lag_shown.lock().expect("progress lock");
        if shown.is_some_and(|(at, last)| last == bytes || at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *shown = Some((Instant::now(), bytes));
        self.line(&format!("move {move_id}: replication lag {bytes} bytes"));
    }

    fn note(&self, move_id: i64, message: &str) {
        self.line(&format!("move {move_id}: {message}"));
    }
}
