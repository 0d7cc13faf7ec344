//! The console's one directory session: it LISTENs on `shard_directory_moves` and reads the
//! moves again on every phase change (and every second while one is open, for its progress),
//! and every page that watches is sent the same snapshot. However many browsers watch, the
//! directory sees this one session.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use shard_directory_connect::{connect_listening, describe, ConnectError};
use shard_directory_mover::{MoveRecord, Mover};
use shard_directory_protocol::MOVES_CHANNEL;
use tokio::sync::watch;

/// The session's `application_name`: a DBA finds the console in `pg_stat_activity` by it.
pub const APPLICATION_NAME: &str = "shard-directory console";

/// How long the moves finished recently stay on the live list.
const RECENT: Duration = Duration::from_secs(3600);

/// How long one read of the moves may take before the session is taken for lost (a directory
/// that accepts connections and answers nothing).
const READ_WITHIN: Duration = Duration::from_secs(10);

/// What the moves were at one read.
#[derive(Default)]
pub struct Snapshot {
    /// Every open move, and those finished in the last hour, newest first.
    pub moves: Vec<MoveRecord>,
    /// When they were read; `None` before the first read.
    pub read_at: Option<SystemTime>,
    /// Why the last read failed, while the session is down.
    pub error: Option<String>,
}

impl Snapshot {
    pub fn open(&self) -> impl Iterator<Item = &MoveRecord> {
        self.moves.iter().filter(|m| m.finished_at.is_none())
    }
}

/// The live snapshot, shared by every watcher.
#[derive(Clone)]
pub struct Live {
    snapshot: watch::Receiver<Arc<Snapshot>>,
}

impl Live {
    /// Starts the session (again after each failure, backing off) on `directory`.
    pub fn start(directory: tokio_postgres::Config) -> Live {
        let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let ended = session(&directory, &tx, &mut failures).await;
                metrics::gauge!("shard_directory_console_listening").set(0.0);
                tracing::warn!(error = %ended, "the console's directory session ended");
                tx.send_modify(|s| {
                    *s = Arc::new(Snapshot {
                        moves: s.moves.clone(),
                        read_at: s.read_at,
                        error: Some(ended),
                    })
                });
                failures = failures.saturating_add(1);
                tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(failures.min(5)))).await;
            }
        });
        Live { snapshot: rx }
    }

    /// The snapshot now.
    pub fn now(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }

    /// A watcher's own receiver: it sees each new snapshot (the latest, if it fell behind).
    pub fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.clone()
    }
}

/// One session: LISTEN, read, and read again on each notification (and each second while a
/// move is open); returns why it ended.
async fn session(
    directory: &tokio_postgres::Config,
    tx: &watch::Sender<Arc<Snapshot>>,
    failures: &mut u32,
) -> String {
    let connecting = connect_listening(directory, APPLICATION_NAME);
    let (client, mut notifications) = match tokio::time::timeout(READ_WITHIN, connecting).await {
        Ok(Ok(c)) => c,
        Ok(Err(ConnectError::Tls(why))) => return format!("configuration: {why}"),
        Ok(Err(ConnectError::Db(e))) => return format!("connect: directory: {}", describe(&e)),
        Err(_) => return format!("connect: directory: no answer within {READ_WITHIN:?}"),
    };
    let listen = format!("LISTEN {}", MOVES_CHANNEL.as_str());
    match tokio::time::timeout(READ_WITHIN, client.batch_execute(&listen)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return format!("LISTEN: {}", describe(&e)),
        Err(_) => return format!("LISTEN: no answer within {READ_WITHIN:?}"),
    }
    metrics::gauge!("shard_directory_console_listening").set(1.0);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut any_open = true;
    loop {
        if any_open {
            let since = humantime::format_rfc3339_seconds(SystemTime::now() - RECENT).to_string();
            let read = Mover::open_or_finished_since(&client, &since);
            let moves = match tokio::time::timeout(READ_WITHIN, read).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => return format!("read the moves: {e}"),
                Err(_) => return format!("read the moves: no answer within {READ_WITHIN:?}"),
            };
            // A session that reads again waits no longer for the next failure.
            *failures = 0;
            metrics::counter!("shard_directory_console_reads_total").increment(1);
            let open_only = moves.iter().filter(|m| m.finished_at.is_none()).count();
            tx.send_replace(Arc::new(Snapshot {
                moves,
                read_at: Some(SystemTime::now()),
                error: None,
            }));
            any_open = open_only > 0;
        }
        tokio::select! {
            heard = notifications.recv() => {
                if heard.is_none() {
                    return "the directory closed the session".into();
                }
                // Those queued meanwhile are covered by the same read.
                while notifications.try_recv().is_ok() {}
                metrics::counter!("shard_directory_console_notifications_total").increment(1);
                any_open = true;
            }
            _ = tick.tick() => {}
        }
    }
}
