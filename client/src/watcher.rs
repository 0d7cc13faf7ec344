//! Push invalidation with a poll fallback: a dedicated connection runs `LISTEN shard_directory`
//! (and `shard_directory_epoch`, which says which history a notified version belongs to) and, on
//! a timer, re-reads the version. On disconnect it reconnects with backoff, re-LISTENs,
//! then re-reads the version, in that order, so a change made while it was away is never missed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::cache::{adopt_epoch, adopt_lower, Advanced, Cache};
use crate::metrics::Counters;
use crate::pool::{self, Connector, Timeouts};
use crate::statements::Statements;
use crate::store::{needs, Changes, Store, SINCE, VERSION_READS};
use shard_directory_protocol::{CHANNEL, EPOCH_CHANNEL, WATCHER_APPLICATION_NAME};
use tokio_postgres::types::{ToSql, Type};

/// What the watcher knows about its own health.
#[derive(Default)]
pub(crate) struct Watch {
    connected: AtomicBool,
    /// Whether notifications reach the watcher's session (it heard its own probe).
    listening: AtomicBool,
    last_heard: Mutex<Option<SystemTime>>,
    last_invalidation: Mutex<Option<SystemTime>>,
    /// A fill read a version newer than the known one: the watcher reads what changed.
    nudge: tokio::sync::Notify,
    /// When the relay's last message was taken, and a wake-up for each.
    relay_heard: Mutex<Option<std::time::Instant>>,
    relayed: tokio::sync::Notify,
}

impl Watch {
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
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

    /// A relay's message was taken.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub fn relay_heard(&self) {
        *self.relay_heard.lock().expect("watch lock") = Some(std::time::Instant::now());
        self.heard();
        self.relayed.notify_one();
    }

    /// How long the relay may stay silent from now before `silence` has passed since its last
    /// message; `None` once it has (or it never spoke).
    fn relay_silent_in(&self, silence: Duration) -> Option<Duration> {
        let heard = (*self.relay_heard.lock().expect("watch lock"))?;
        silence
            .checked_sub(heard.elapsed())
            .filter(|d| !d.is_zero())
    }

    /// Asks the watcher to read what changed (without waiting for a notification or the poll).
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// The one path by which a newer version reaches the cache, whoever read it (the watcher,
    /// a refresh): retires the entries that changed, or all of them when the directory could not
    /// say which; counted, and timed when `late` (a poll or a reconnect brought it, not a
    /// notification). Returns whether it was news.
    /// A read in another epoch, or below the version known when it began (`since`: the
    /// directory went back), flushes the cache instead.
    pub fn learned(
        &self,
        cache: &Cache,
        counters: &Counters,
        changes: &Changes,
        late: bool,
    ) -> bool {
        let new_history = changes
            .epoch
            .as_deref()
            .is_some_and(|epoch| adopt_epoch(cache, counters, epoch, changes.version));
        let went_back = !new_history
            && changes.version < changes.since
            && adopt_lower(cache, counters, changes.since, changes.version);
        if !new_history && !went_back {
            match cache.advance(changes.since, changes.version, changes.changed.as_deref()) {
                Advanced::NoNews => return false,
                Advanced::Flushed => counters.flushed(),
                Advanced::ByEntity => {}
            }
        }
        *self.last_invalidation.lock().expect("watch lock") = Some(SystemTime::now());
        counters.invalidated(changes.version, changes.age.filter(|_| late));
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
    /// Where a notified change is read when the directory has replicas.
    pub store: Arc<Store>,
    /// With a relay: how long it may stay silent before the watcher LISTENs itself.
    pub relay_silence: Option<Duration>,
}

/// How often the watcher polls when notifications do not reach it.
const DEAF_POLL: Duration = Duration::from_secs(1);

/// `work`, or [`Ended::Timeout`] naming `what` after `after`.
async fn within<T, E>(
    what: &'static str,
    after: Duration,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, Ended>
where
    Ended: From<E>,
{
    match tokio::time::timeout(after, work).await {
        Ok(done) => Ok(done?),
        Err(_) => Err(Ended::Timeout(what, after)),
    }
}

impl Watcher {
    /// Applies what a read of the directory brought (`late`: see [`Watch::learned`]).
    fn apply(&self, changes: &Changes, late: bool) {
        self.watch.heard();
        self.watch
            .learned(&self.cache, &self.counters, changes, late);
    }

    /// Reads what changed on a replica that has replayed `at_least` (the version notified),
    /// and applies it; false when there is none to read there (no replicas, none caught up, a
    /// payload that is not a version), and the caller reads the primary.
    async fn read_on_replica(&self, at_least: Option<i64>) -> bool {
        let Some(at_least) = at_least else {
            return false;
        };
        let since = self.cache.version();
        let history = self.cache.history();
        let changes = self
            .store
            .changes_on_replica(since, at_least, history.as_deref(), !self.cache.went_back())
            .await;
        match changes {
            Some(changes) => {
                self.apply(&changes, false);
                true
            }
            None => false,
        }
    }

    /// LISTENs, and says whether notifications reach this session: behind a transaction-mode
    /// pooler, LISTEN runs on a server connection the pooler then lends to others, and the
    /// watcher would hear nothing while it looks connected. The proof: a notification on a
    /// channel of its own, sent from another connection, heard within the query timeout.
    async fn listens(
        &self,
        client: &tokio_postgres::Client,
        notifications: &mut pool::Messages,
        config: tokio_postgres::Config,
    ) -> Result<bool, Ended> {
        let (connect, query) = (self.timeouts.connect, self.timeouts.query);
        // Hex digits only: a valid identifier as it is.
        let probe = format!("shard_directory_probe_{:016x}", fastrand::u64(..));
        let listen = format!("LISTEN {CHANNEL}; LISTEN {EPOCH_CHANNEL}; LISTEN {probe}");
        within("LISTEN", query, client.batch_execute(&listen)).await?;
        let (sender, _, _driver) = within(
            "the probe's connection",
            connect,
            pool::connect(config, connect, &self.tls),
        )
        .await?;
        let notify = format!("NOTIFY {probe}");
        within("the probe", query, sender.batch_execute(&notify)).await?;
        let heard = async {
            // Notifications of the directory's heard meanwhile: the first read covers them.
            while let Some(message) = notifications.recv().await {
                if message?.channel() == probe {
                    return Ok(true);
                }
            }
            Ok::<_, tokio_postgres::Error>(false)
        };
        match tokio::time::timeout(query, heard).await {
            Ok(heard) => Ok(heard?),
            Err(_) => Ok(false),
        }
    }

    pub async fn run(self) {
        let mut failures = 0;
        if let Some(silence) = self.relay_silence {
            // A fleet starting at once waits for the relay rather than each opening a LISTEN
            // connection it would close a moment later.
            let _ = tokio::time::timeout(silence, self.watch.relayed.notified()).await;
        }
        loop {
            if let Some(silence) = self.relay_silence {
                self.while_relayed(silence).await;
            }
            let err = self.session(&mut failures).await;
            if matches!(err, Ended::Relayed) {
                tracing::info!("the relay took over from the shard directory watcher");
                continue;
            }
            self.watch.connected.store(false, Ordering::SeqCst);
            self.counters.watcher_connected(false);
            let wait =
                crate::backoff::jittered(Duration::from_millis(50), failures, self.max_backoff);
            tracing::warn!(error = %err, retry_in = ?wait, "shard directory watcher disconnected");
            failures = failures.saturating_add(1);
            tokio::time::sleep(wait).await;
        }
    }

    /// While the relay's messages arrive, no connection: they keep the cache current. Returns
    /// once it has been silent for `silence` (at once if it has not spoken yet).
    async fn while_relayed(&self, silence: Duration) {
        let mut relayed = false;
        while let Some(left) = self.watch.relay_silent_in(silence) {
            if !relayed {
                relayed = true;
                self.watch.connected.store(true, Ordering::SeqCst);
                self.counters.watcher_connected(true);
            }
            tokio::time::sleep(left).await;
        }
        if relayed {
            self.watch.connected.store(false, Ordering::SeqCst);
            self.counters.watcher_connected(false);
            tracing::warn!(
                ?silence,
                "the relay went silent: listening to the shard directory"
            );
        }
    }

    /// One connection's life; returns why it ended.
    async fn session(&self, failures: &mut u32) -> Ended {
        let mut config = self.config.clone();
        config.application_name(WATCHER_APPLICATION_NAME);
        // tokio-postgres bounds the TCP connect only: a proxy that accepts and never answers
        // would hold the startup, and the watcher, forever.
        let connect = pool::connect(config.clone(), self.timeouts.connect, &self.tls);
        let (client, mut notifications, _driver) =
            match within("the connection", self.timeouts.connect, connect).await {
                Ok(c) => c,
                Err(e) => return e,
            };
        let session = async || -> Result<std::convert::Infallible, Ended> {
            let listening =
                self.listen && self.listens(&client, &mut notifications, config).await?;
            self.watch.listening.store(listening, Ordering::SeqCst);
            let poll_interval = if self.listen && !listening {
                tracing::warn!(poll = ?DEAF_POLL.min(self.poll_interval), "notifications do not \
                    reach the shard directory watcher (is the directory address a \
                    transaction-mode pooler? point listen_config at PostgreSQL itself): polling");
                DEAF_POLL.min(self.poll_interval)
            } else {
                self.poll_interval
            };
            // The best of the version reads the directory answers: without changes_since()
            // (an older extension, a role not granted it), the version alone and a flush on
            // every change; without directory_epoch(), no epoch.
            let mut read = SINCE;
            let mut poll: Option<tokio_postgres::Statement> = None;
            let mut query_changes = async |since: i64| -> Result<Changes, tokio_postgres::Error> {
                loop {
                    let sql = VERSION_READS[read];
                    let (params, types): (&[&(dyn ToSql + Sync)], &[Type]) = if read == SINCE {
                        (&[&since], &[Type::INT8])
                    } else {
                        (&[], &[])
                    };
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
                        Err(e)
                            if read + 1 < VERSION_READS.len()
                                && Changes::unavailable_as(&e, needs(read)) =>
                        {
                            read += 1;
                            poll = None;
                            continue;
                        }
                        row => Ok(Changes::from_row(since, &row?)),
                    };
                }
            };
            // A directory that does not answer within the query timeout ends the session: the
            // watcher reconnects (and lookups meanwhile go to the store).
            let after = self.timeouts.query;
            let mut read_once = async |since: i64| -> Result<Changes, Ended> {
                within("the version poll", after, query_changes(since)).await
            };
            // Where this session's notifications are heard: the epoch and server of its last
            // read; `None` before it, and once a notification on EPOCH_CHANNEL said a new epoch
            // began (which one is the next read's to say: anyone may NOTIFY).
            let heard_in = Mutex::new(None::<(Option<String>, Option<String>)>);
            // `late`: a poll or a reconnect, not a notification, asked for this read.
            let mut read = async |late: bool| -> Result<(), Ended> {
                let changes = read_once(self.cache.version()).await?;
                self.store.primary_said(
                    changes.epoch.as_deref(),
                    changes.server.as_deref(),
                    changes.version,
                );
                *heard_in.lock().expect("heard lock") =
                    Some((changes.epoch.clone(), changes.server.clone()));
                self.apply(&changes, late);
                Ok(())
            };
            read(true).await?;
            self.watch.connected.store(true, Ordering::SeqCst);
            self.counters.watcher_connected(true);
            tracing::info!(
                version = self.cache.version(),
                "shard directory watcher connected"
            );
            *failures = 0;
            let mut ticker = tokio::time::interval(poll_interval);
            ticker.tick().await;
            loop {
                tokio::select! {
                    n = notifications.recv() => match n {
                        // Anyone who can connect may NOTIFY: the payload is a hint to read the
                        // version, never the version itself. Notifications already queued are
                        // covered by the same read.
                        Some(Ok(n)) => {
                            let mut heard = Heard::new(self.cache.version());
                            heard.take(&n, &heard_in, &self.store);
                            while let Ok(more) = notifications.try_recv() {
                                heard.take(&more?, &heard_in, &self.store);
                            }
                            if heard.news && !self.read_on_replica(heard.version.flatten()).await {
                                read(false).await?;
                            }
                        }
                        Some(Err(e)) => return Err(Ended::Db(e)),
                        // The connection ended without an error message: the next query
                        // returns the "connection closed" error that ends this session.
                        None => { client.simple_query("").await?; }
                    },
                    _ = ticker.tick() => read(true).await?,
                    _ = self.watch.relayed.notified(), if self.relay_silence.is_some() => {
                        let silence = self.relay_silence.unwrap_or_default();
                        if self.watch.relay_silent_in(silence).is_some() {
                            return Err(Ended::Relayed);
                        }
                    }
                    _ = self.watch.nudge.notified() => {
                        let newer = Some(self.cache.version() + 1);
                        if !self.read_on_replica(newer).await {
                            read(false).await?;
                        }
                    }
                }
            }
        };
        match session().await {
            Err(e) => e,
            Ok(never) => match never {},
        }
    }
}

/// What notifications heard at once say: whether any is news, and the newest version they name
/// (`Some(None)` when a payload on [`CHANNEL`] is not a version; `None` before one).
struct Heard {
    known: i64,
    news: bool,
    version: Option<Option<i64>>,
}

impl Heard {
    fn new(known: i64) -> Heard {
        Heard {
            known,
            news: false,
            version: None,
        }
    }

    /// Takes `n`, heard in `heard_in`, telling `store` each version notified and where. A new
    /// epoch's notification says that the versions after it are of a history this session has
    /// not read: they are not told as the one it read (its payload is not taken as that history:
    /// a forged one would name the history the client trusts).
    fn take(
        &mut self,
        n: &tokio_postgres::Notification,
        heard_in: &Mutex<Option<(Option<String>, Option<String>)>>,
        store: &Store,
    ) {
        if n.channel() == EPOCH_CHANNEL.as_str() {
            *heard_in.lock().expect("heard lock") = None;
            return;
        }
        if n.channel() != CHANNEL.as_str() {
            return;
        }
        let v = n.payload().parse::<i64>().ok();
        self.news |= v.is_none_or(|v| v > self.known);
        self.version = Some(match self.version {
            None => v,
            Some(heard) => heard.zip(v).map(|(a, b)| a.max(b)),
        });
        if let (Some(v), Some((epoch, server))) = (v, &*heard_in.lock().expect("heard lock")) {
            store.primary_notified(epoch.as_deref(), server.as_deref(), v);
        }
    }
}

/// Why a watcher session ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
    #[error("the directory did not answer {0} within {1:?}")]
    Timeout(&'static str, Duration),
    #[error("the relay took over")]
    Relayed,
}
