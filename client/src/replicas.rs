//! The directory's streaming replicas (`DirectoryConfig::replicas`): fills and the watcher's
//! reads of what changed go there, so that the primary serves writes and notifications. A
//! replica replays the primary's commits in order, so a read there at version `v` is the
//! directory at `v`; only a read at the version the client needs, in the history it knows, is
//! taken. Behind that, a read is tried again until `replica_wait` runs out, then made on the
//! primary; a replica that does not answer is left alone for a while.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;

use crate::error::{Error, Result};
use crate::metrics::Counters;
use crate::pool::{self, Connector, Timeouts};

/// How long a replica that did not answer is left out.
const RESTING: Duration = Duration::from_secs(1);

/// How often a read behind the version it needs is tried again.
const REPLAY_POLL: Duration = Duration::from_millis(2);

pub(crate) struct Replica {
    pub pool: Pool,
    /// Until when (time since `Replicas::opened`, in µs) the replica is left out.
    resting_until: AtomicU64,
}

pub(crate) struct Replicas {
    replicas: Vec<Replica>,
    next: AtomicUsize,
    wait: Duration,
    opened: Instant,
}

/// Where a read stands: its version, the directory's epoch it was read in, and whether the
/// server was a standby then.
pub(crate) struct Read<'a> {
    pub version: i64,
    pub epoch: Option<&'a str>,
    pub recovering: bool,
}

/// A read that says where it stands.
pub(crate) trait Versioned {
    fn read_at(&self) -> Read<'_>;
}

impl Replicas {
    pub fn new(
        configs: Vec<tokio_postgres::Config>,
        size: usize,
        timeouts: Timeouts,
        tls: &Connector,
        wait: Duration,
    ) -> Result<Replicas> {
        let replicas = configs
            .into_iter()
            .map(|config| {
                let pool = pool::build(config, size, timeouts, tls)
                    .map_err(|e| Error::Config(format!("replica pool: {e}")))?;
                Ok(Replica {
                    pool,
                    resting_until: AtomicU64::new(0),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Replicas {
            replicas,
            next: AtomicUsize::new(0),
            wait,
            opened: Instant::now(),
        })
    }

    fn now(&self) -> u64 {
        self.opened.elapsed().as_micros() as u64
    }

    /// The next replica in turn that is not resting.
    fn pick(&self) -> Option<&Replica> {
        let n = self.replicas.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now();
        (0..n)
            .map(|i| &self.replicas[(start + i) % n])
            .find(|r| r.resting_until.load(Ordering::Relaxed) <= now)
    }

    /// `read` made on a replica, once it has replayed `at_least` in the epoch `history` (`None`:
    /// any), while it is a standby and not past what the primary said (`confirmed`: its epoch
    /// and newest version); `None` when no replica could within the wait (the caller reads the
    /// primary).
    pub async fn read<'s, T: Versioned>(
        &'s self,
        at_least: i64,
        history: Option<&str>,
        confirmed: &(Option<String>, i64),
        counters: &Counters,
        read: impl Fn(&'s Pool) -> BoxFuture<'s, Result<T>>,
    ) -> Option<T> {
        let replica = self.pick()?;
        let deadline = Instant::now() + self.wait;
        loop {
            match read(&replica.pool).await {
                Ok(found) => {
                    let Read {
                        version: at,
                        epoch,
                        recovering,
                    } = found.read_at();
                    if !recovering {
                        // Promoted (a failover's, or a stray one): it goes on a history of its
                        // own, which only the primary may say is the directory's.
                        counters.replica_read("promoted");
                        return None;
                    }
                    if (history.is_some() && epoch != history) || epoch != confirmed.0.as_deref() {
                        // Still replaying a history the primary left (or not yet the one it
                        // is on): only the primary says which history is current.
                        counters.replica_read("elsewhere");
                        return None;
                    }
                    if at > confirmed.1 {
                        // Past what the primary said: a standby that replayed commits a
                        // restored primary no longer has looks just like one that is ahead.
                        counters.replica_read("ahead");
                        return None;
                    }
                    if at >= at_least {
                        counters.replica_read("served");
                        return Some(found);
                    }
                    if Instant::now() >= deadline {
                        counters.replica_read("behind");
                        return None;
                    }
                    tokio::time::sleep(REPLAY_POLL).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "directory replica read failed");
                    if e.is_directory_outage() {
                        let until = self.now() + RESTING.as_micros() as u64;
                        replica.resting_until.store(until, Ordering::Relaxed);
                    }
                    counters.replica_read("failed");
                    return None;
                }
            }
        }
    }
}
