//! Push invalidation with a poll fallback: a dedicated connection runs `LISTEN shard_directory`
//! and, on a timer, re-reads the version. On disconnect it reconnects with backoff, re-LISTENs,
//! then re-reads the version, in that order, so a change made while it was away is never missed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::cache::{Advanced, Cache};
use crate::directory::adopt_lower;
use crate::metrics::Counters;
use crate::pool::{self, Connector, Timeouts};
use crate::statements::Statements;
use crate::store::{Changes, CHANGES, CURRENT_VERSION};
use tokio_postgres::types::{ToSql, Type};

/// What the watcher knows about its own health.
#[derive(Default)]
pub(crate) struct Watch {
    connected: AtomicBool,
    last_heard: Mutex<Option<SystemTime>>,
    last_invalidation: Mutex<Option<SystemTime>>,
    /// A fill read a version newer than the known one: the watcher reads what changed.
    nudge: tokio::sync::Notify,
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

    /// Asks the watcher to read what changed (without waiting for a notification or the poll).
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// The one path by which a newer version reaches the cache, whoever read it (the watcher,
    /// a refresh): retires the entries that changed, or all of them when the directory could not
    /// say which; counted and timed. Returns whether it was news.
    pub fn learned(&self, cache: &Cache, counters: &Counters, changes: &Changes) -> bool {
        match cache.advance(changes.since, changes.version, changes.changed.as_deref()) {
            Advanced::NoNews => return false,
            Advanced::Flushed => counters.flushed(),
            Advanced::ByEntity => {}
        }
        *self.last_invalidation.lock().expect("watch lock") = Some(SystemTime::now());
        counters.invalidated(changes.version, changes.age);
        tracing::debug!(
            version = changes.version,
            changed = changes.changed.as_ref().map(Vec::len),
            "shard directory changed"
        );
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
    /// Applies what a read of the directory brought.
    fn apply(&self, changes: &Changes) {
        self.watch.heard();
        self.watch.learned(&self.cache, &self.counters, changes);
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
            // An extension older than changes_since(), or a role not granted it: the version
            // alone, and a flush on every change.
            let mut by_entity = true;
            let mut poll: Option<tokio_postgres::Statement> = None;
            let mut query_changes = async |since: i64| -> Result<Changes, tokio_postgres::Error> {
                loop {
                    let (sql, types): (&str, &[Type]) = if by_entity {
                        (CHANGES, &[Type::INT8])
                    } else {
                        (CURRENT_VERSION, &[])
                    };
                    let params: &[&(dyn ToSql + Sync)] = if by_entity { &[&since] } else { &[] };
                    let row = match self.statements {
                        Statements::Prepared => match &poll {
                            Some(statement) => client.query_one(statement, params).await,
                            None => match client.prepare_typed(sql, types).await {
                                Ok(statement) => {
                                    client.query_one(poll.insert(statement), params).await
                                }
                                Err(e) => Err(e),
                            },
                        },
                        _ => {
                            let typed: Vec<_> = params
                                .iter()
                                .zip(types)
                                .map(|(p, t)| (*p, t.clone()))
                                .collect();
                            client.query_typed_one(sql, &typed).await
                        }
                    };
                    return match row {
                        Err(e) if by_entity && Changes::unavailable(&e) => {
                            by_entity = false;
                            poll = None;
                            continue;
                        }
                        row => Ok(Changes::from_row(since, &row?)),
                    };
                }
            };
            // Below the known version once is a race with a fill that read later; twice in a row,
            // the directory went back. A directory that does not answer within the query timeout
            // ends the session: the watcher reconnects (and lookups meanwhile go to the store).
            let after = self.timeouts.query;
            let mut read_once = async |since: i64| -> Result<Changes, Ended> {
                tokio::time::timeout(after, query_changes(since))
                    .await
                    .map_err(|_| Ended::Timeout(after))?
                    .map_err(Ended::Db)
            };
            let mut read = async || -> Result<(), Ended> {
                let known = self.cache.version();
                let mut changes = read_once(known).await?;
                if changes.version < known {
                    changes = read_once(known).await?;
                    if changes.version < known {
                        adopt_lower(&self.cache, &self.counters, known, changes.version);
                    }
                }
                self.apply(&changes);
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
                    _ = self.watch.nudge.notified() => read().await?,
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
