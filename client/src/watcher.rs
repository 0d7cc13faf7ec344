//! Push invalidation with a poll fallback: a dedicated connection runs `LISTEN shard_directory`
//! and, on a timer, re-reads the version. On disconnect it reconnects with backoff, re-LISTENs,
//! then re-reads the version, in that order, so a change made while it was away is never missed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::cache::Cache;
use crate::directory::adopt_lower;
use crate::metrics::Counters;
use crate::pool::{self, Connector, Timeouts};
use crate::statements::Statements;
use crate::store::CURRENT_VERSION;

/// What the watcher knows about its own health.
#[derive(Default)]
pub(crate) struct Watch {
    connected: AtomicBool,
    last_heard: Mutex<Option<SystemTime>>,
    last_invalidation: Mutex<Option<SystemTime>>,
}

impl Watch {
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    pub fn last_heard(&self) -> Option<SystemTime> {
        *self.last_heard.lock().expect("watch lock")
    }

    pub fn last_invalidation(&self) -> Option<SystemTime> {
        *self.last_invalidation.lock().expect("watch lock")
    }

    fn heard(&self) {
        *self.last_heard.lock().expect("watch lock") = Some(SystemTime::now());
    }

    /// The one path by which a newer version reaches the cache, whoever learned it (the
    /// watcher, a fill, a refresh, a shard's `moved` refusal): it retires older entries, is
    /// counted and timed. Returns whether it was news.
    pub fn learned(
        &self,
        cache: &Cache,
        counters: &Counters,
        version: i64,
        lag: Option<Duration>,
    ) -> bool {
        if !cache.invalidate(version) {
            return false;
        }
        *self.last_invalidation.lock().expect("watch lock") = Some(SystemTime::now());
        counters.invalidated(version, lag);
        tracing::debug!(version, "shard directory changed");
        true
    }
}

pub(crate) struct Watcher {
    pub config: tokio_postgres::Config,
    pub statements: Statements,
    pub tls: Connector,
    pub cache: Arc<Cache>,
    pub watch: Arc<Watch>,
    pub counters: Arc<Counters>,
    pub poll_interval: Duration,
    pub timeouts: Timeouts,
    pub max_backoff: Duration,
    pub listen: bool,
}

/// How the watcher's connection shows up in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "shard_directory_watcher";

impl Watcher {
    /// Applies a version heard from the directory.
    fn apply(&self, version: i64, lag: Option<Duration>) {
        self.watch.heard();
        self.watch
            .learned(&self.cache, &self.counters, version, lag);
    }

    pub async fn run(self) {
        let mut failures = 0;
        loop {
            let err = self.session(&mut failures).await;
            self.watch.connected.store(false, Ordering::SeqCst);
            self.counters.watcher_connected(false);
            let wait =
                crate::backoff::jittered(Duration::from_millis(50), failures, self.max_backoff);
            tracing::warn!(error = %err, retry_in = ?wait, "shard directory watcher disconnected");
            failures = failures.saturating_add(1);
            tokio::time::sleep(wait).await;
        }
    }

    /// One connection's life; returns why it ended.
    async fn session(&self, failures: &mut u32) -> Ended {
        let mut config = self.config.clone();
        config.application_name(APPLICATION_NAME);
        let (client, mut notifications, _driver) =
            match pool::connect(config, self.timeouts.connect, &self.tls).await {
                Ok(c) => c,
                Err(e) => return Ended::Db(e),
            };
        let mut session = async || -> Result<std::convert::Infallible, Ended> {
            if self.listen {
                client.batch_execute("LISTEN shard_directory").await?;
            }
            let poll = match self.statements {
                Statements::Prepared => Some(client.prepare(CURRENT_VERSION).await?),
                _ => None,
            };
            let query_version =
                async || -> Result<(i64, Option<Duration>), tokio_postgres::Error> {
                    let row = match &poll {
                        Some(poll) => client.query_one(poll, &[]).await?,
                        None => client.query_typed_one(CURRENT_VERSION, &[]).await?,
                    };
                    Ok((
                        row.get(0),
                        Duration::try_from_secs_f64(row.get::<_, f64>(1)).ok(),
                    ))
                };
            // Below the known version once is a race with a fill that read later; twice in a row,
            // the directory went back. A directory that does not answer within the query timeout
            // ends the session: the watcher reconnects (and lookups meanwhile go to the store).
            let after = self.timeouts.query;
            let read_once = async || -> Result<(i64, Option<Duration>), Ended> {
                tokio::time::timeout(after, query_version())
                    .await
                    .map_err(|_| Ended::Timeout(after))?
                    .map_err(Ended::Db)
            };
            let read = async || -> Result<(), Ended> {
                let (mut version, mut lag) = read_once().await?;
                let known = self.cache.version();
                if version < known {
                    (version, lag) = read_once().await?;
                    if version < known {
                        adopt_lower(&self.cache, &self.counters, known, version);
                    }
                }
                self.apply(version, lag);
                Ok(())
            };
            read().await?;
            self.watch.connected.store(true, Ordering::SeqCst);
            self.counters.watcher_connected(true);
            tracing::info!(
                version = self.cache.version(),
                "shard directory watcher connected"
            );
            *failures = 0;
            let mut ticker = tokio::time::interval(self.poll_interval);
            ticker.tick().await;
            loop {
                tokio::select! {
                    n = notifications.recv() => match n {
                        // Anyone who can connect may NOTIFY: the payload is a hint to read the
                        // version, never the version itself. Notifications already queued are
                        // covered by the same read.
                        Some(Ok(n)) => {
                            let known = self.cache.version();
                            let mut news = n.payload().parse::<i64>().map_or(true, |v| v > known);
                            while let Ok(more) = notifications.try_recv() {
                                news |= more?.payload().parse::<i64>().map_or(true, |v| v > known);
                            }
                            if news {
                                read().await?;
                            }
                        }
                        Some(Err(e)) => return Err(Ended::Db(e)),
                        // The connection ended without an error message: the next query
                        // returns the "connection closed" error that ends this session.
                        None => { client.simple_query("").await?; }
                    },
                    _ = ticker.tick() => read().await?,
                }
            }
        };
        match session().await {
            Err(e) => e,
            Ok(never) => match never {},
        }
    }
}

/// Why a watcher session ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
    #[error("the directory did not answer the version poll within {0:?}")]
    Timeout(Duration),
}

/// Aborts a spawned task when dropped.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
