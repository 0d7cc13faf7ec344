//! The console's one directory session: it LISTENs on `shard_directory_moves` and reads the
//! moves and batches again on every phase change (and every second while a move is open, for
//! its progress, with the slots' lag read on a session per source shard, or a batch runs;
//! every 5 s otherwise), and every page that watches is sent the same snapshot, rendered once.
//! However many browsers watch, the directory sees this one session.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use shard_directory_connect::{connect_listening, describe, ConnectError};
use shard_directory_mover::{BatchState, BatchStatus, Error, MoveRecord, Mover, Slot, Slots};
use shard_directory_protocol::MOVES_CHANNEL;
use tokio::sync::watch;
use tokio_postgres::error::SqlState;

/// The session's `application_name`: a DBA finds the console in `pg_stat_activity` by it.
pub const APPLICATION_NAME: &str = "shard-directory console";

/// How long the moves finished recently stay on the live list.
const RECENT: Duration = Duration::from_secs(3600);

/// How often the moves and batches are read when no move is open, no batch runs and nothing
/// was notified: a batch's own changes (recorded, paused, a paused batch aborted) notify
/// nothing.
const IDLE_READ: Duration = Duration::from_secs(5);

/// How long one read of the moves may take before the session is taken for lost (a directory
/// that accepts connections and answers nothing).
const READ_WITHIN: Duration = Duration::from_secs(10);

/// How long each statement of the session may run on the directory (`statement_timeout`):
/// less than [`READ_WITHIN`], so that a statement held up (by a lock on the moves, say) is
/// ended by the directory before the session gives up on it. A statement left waiting there
/// keeps its backend, a second console session beside the next, one more at each try.
const STATEMENT_WITHIN: Duration = Duration::from_secs(9);

/// How long a page asked for before the session's first read waits for it: well inside a
/// page's own bound, so that a directory that answers nothing still gets the page an answer
/// (saying the moves were not read) long before the browser gives up.
const FIRST_READ_WAIT: Duration = Duration::from_secs(5);

/// What the moves were at one read.
#[derive(Default)]
pub struct Snapshot {
    /// Every open move, and those finished in the last hour, newest first.
    pub moves: Vec<MoveRecord>,
    /// The slot each open logical (or reversible) move streams through, by move id, when its
    /// shard answered.
    pub slots: BTreeMap<i64, Slot>,
    /// Every open batch, and those finished in the last hour, newest first.
    pub batches: Vec<BatchStatus>,
    /// When they were read; `None` before the first read.
    pub read_at: Option<SystemTime>,
    /// Why the last read failed, while the session is down.
    pub error: Option<String>,
    /// The moves list as sent to every watcher: rendered once, by the first that asks.
    rendered: OnceLock<String>,
}

impl Snapshot {
    /// What a read found, now.
    fn read(moves: Vec<MoveRecord>, slots: BTreeMap<i64, Slot>, batches: Vec<BatchStatus>) -> Self {
        Snapshot {
            moves,
            slots,
            batches,
            read_at: Some(SystemTime::now()),
            error: None,
            rendered: OnceLock::new(),
        }
    }

    pub fn open(&self) -> impl Iterator<Item = &MoveRecord> {
        self.moves.iter().filter(|m| m.finished_at.is_none())
    }

    /// `render(self)`, made once per snapshot however many watchers send it.
    pub fn rendered(&self, render: impl FnOnce(&Snapshot) -> String) -> &str {
        self.rendered.get_or_init(|| render(self))
    }
}

/// The live snapshot, shared by every watcher.
#[derive(Clone)]
pub struct Live {
    snapshot: watch::Receiver<Arc<Snapshot>>,
}

impl Live {
    /// Starts the session (again after each failure, backing off) on `directory`; `slots` reads
    /// the open moves' slots.
    pub fn start(directory: tokio_postgres::Config, mut slots: Slots) -> Live {
        let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let ended = session(&directory, &mut slots, &tx, &mut failures).await;
                metrics::gauge!("shard_directory_console_listening").set(0.0);
                tracing::warn!(error = %ended, "the console's directory session ended");
                tx.send_modify(|s| {
                    *s = Arc::new(Snapshot {
                        moves: s.moves.clone(),
                        slots: s.slots.clone(),
                        batches: s.batches.clone(),
                        read_at: s.read_at,
                        error: Some(ended),
                        rendered: OnceLock::new(),
                    })
                });
                failures = failures.saturating_add(1);
                tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(failures.min(5)))).await;
            }
        });
        Live { snapshot: rx }
    }

    /// The snapshot once the session has read the moves, or failed to, waiting at most
    /// [`FIRST_READ_WAIT`] for the first read: a page asked for just after the console started
    /// shows the moves, not that none were read yet.
    pub async fn read(&self) -> Arc<Snapshot> {
        let mut rx = self.snapshot.clone();
        let first = rx.wait_for(|s| s.read_at.is_some() || s.error.is_some());
        let _ = tokio::time::timeout(FIRST_READ_WAIT, first).await;
        self.now()
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
    slots: &mut Slots,
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
    let listen = format!(
        "SET statement_timeout = {}; LISTEN {}",
        STATEMENT_WITHIN.as_millis(),
        MOVES_CHANNEL.as_str()
    );
    match tokio::time::timeout(READ_WITHIN, client.batch_execute(&listen)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return format!("LISTEN: {}", describe(&e)),
        Err(_) => return format!("LISTEN: no answer within {READ_WITHIN:?}"),
    }
    metrics::gauge!("shard_directory_console_listening").set(1.0);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut any_open = true;
    let mut last_read: Option<tokio::time::Instant> = None;
    loop {
        let idle_long = last_read.is_none_or(|at| at.elapsed() >= IDLE_READ);
        if any_open || idle_long {
            last_read = Some(tokio::time::Instant::now());
            let since = humantime::format_rfc3339_seconds(SystemTime::now() - RECENT).to_string();
            let read = async {
                let moves = Mover::open_or_finished_since(&client, &since).await?;
                let batches = match Mover::batches_open_or_finished_since(&client, &since).await {
                    Ok(b) => b,
                    // A role granted the moves but not the batches (docs/operations.md grants
                    // the DBA both) still sees the moves; a batch's page says why it cannot.
                    Err(Error::Db { source, .. })
                        if source.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) =>
                    {
                        Vec::new()
                    }
                    Err(e) => return Err(e),
                };
                Ok::<_, Error>((moves, batches))
            };
            let (moves, batches) = match tokio::time::timeout(READ_WITHIN, read).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => return format!("read the moves: {e}"),
                Err(_) => return format!("read the moves: no answer within {READ_WITHIN:?}"),
            };
            // The first read is shown at once: the pages that wait for it do not wait for the
            // slots too (a shard that answers nothing costs its read a few seconds).
            if tx.borrow().read_at.is_none() {
                tx.send_replace(Arc::new(Snapshot::read(
                    moves.clone(),
                    BTreeMap::new(),
                    batches.clone(),
                )));
            }
            // Each shard bounds its own read; a slow one is left out of this read, not waited on.
            let slots = tokio::time::timeout(READ_WITHIN, slots.read(&client, &moves))
                .await
                .unwrap_or_default();
            // A session that reads again waits no longer for the next failure.
            *failures = 0;
            metrics::counter!("shard_directory_console_reads_total").increment(1);
            // A batch's own state changes notify nothing: read again each second while one
            // runs (or aborts), so that its end is seen, between its moves and after the last.
            let open_only = moves.iter().filter(|m| m.finished_at.is_none()).count()
                + batches
                    .iter()
                    .filter(|b| matches!(b.state, BatchState::Running | BatchState::Aborting))
                    .count();
            tx.send_replace(Arc::new(Snapshot::read(moves, slots, batches)));
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
