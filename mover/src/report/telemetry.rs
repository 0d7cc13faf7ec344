//! What moves report through the `metrics` facade, to whatever recorder the program installed
//! (the CLI serves Prometheus text with `--metrics-addr`): the phases entered, each freeze's
//! length, rows copied and deleted per table, the target's lag and the WAL the slot keeps.
//! [`Metered`] wraps the move's observer, so every report goes both ways.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::future::BoxFuture;

use crate::directory::phase::Phase;
use crate::error::Step;
use crate::report::observer::Observer;

/// An observer that records metrics, then tells the one it wraps.
pub(crate) struct Metered {
    inner: Arc<dyn Observer>,
    /// When each move still frozen froze.
    frozen_since: Mutex<HashMap<i64, Instant>>,
}

impl Metered {
    pub fn new(inner: Arc<dyn Observer>) -> Metered {
        Metered {
            inner,
            frozen_since: Mutex::default(),
        }
    }
}

impl Observer for Metered {
    fn phase(&self, move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        metrics::counter!("shard_directory_move_phases_total", "phase" => phase.as_str())
            .increment(1);
        let mut frozen = self.frozen_since.lock().expect("not poisoned");
        if phase == Phase::Frozen {
            frozen.insert(move_id, Instant::now());
        } else if let Some(since) = frozen.remove(&move_id) {
            metrics::histogram!("shard_directory_move_freeze_seconds")
                .record(since.elapsed().as_secs_f64());
        }
        self.inner.phase(move_id, phase)
    }

    fn step(&self, move_id: i64, step: Step) -> BoxFuture<'_, ()> {
        self.inner.step(move_id, step)
    }

    fn rows(&self, move_id: i64, table: &str, done: i64, total: i64) {
        let id = move_id.to_string();
        let labels = [("move_id", id), ("table", table.to_owned())];
        metrics::gauge!("shard_directory_move_rows_done", &labels).set(done as f64);
        metrics::gauge!("shard_directory_move_rows_total", &labels).set(total as f64);
        self.inner.rows(move_id, table, done, total)
    }

    fn lag(&self, move_id: i64, bytes: i64) {
        metrics::gauge!("shard_directory_move_lag_bytes", "move_id" => move_id.to_string())
            .set(bytes as f64);
        self.inner.lag(move_id, bytes)
    }

    fn note(&self, move_id: i64, message: &str) {
        self.inner.note(move_id, message)
    }
}

/// The WAL a logical move's slot keeps on its source.
pub(crate) fn retained_wal(move_id: i64, bytes: i64) {
    metrics::gauge!("shard_directory_move_retained_wal_bytes", "move_id" => move_id.to_string())
        .set(bytes as f64);
}
