//! `Directory`: lookups from the in-process cache, misses from the store, kept current by the
//! watcher, with the outage policy applied when the directory cannot be reached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

#[cfg(feature = "redis")]
use crate::cache::Shared;
use crate::cache::{adopt_epoch, adopt_lower, Cache, Lookup};
use crate::entry::{AsKeyRef, EntityKey, Entry, KeyRef, State};
use crate::error::{Error, Result};
use crate::metrics::{Counters, Stats};
use crate::name::Name;
use crate::policy::{Cached, Policy};
use crate::pool::{AbortOnDrop, Timeouts};
use crate::replicas::Replicas;
use crate::statements::Statements;
use crate::store::{Fetched, Store};
use crate::watcher::{Watch, Watcher};

/// How a [`Directory`] behaves.
///
/// ```
/// use std::time::Duration;
/// use shard_directory_client::{DirectoryConfig, Policy};
/// let config = DirectoryConfig::default()
///     .policy(Policy::FailClosed)
///     .poll_interval(Duration::from_secs(10));
/// assert_eq!(config.poll_interval, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DirectoryConfig {
    /// How often the watcher re-reads the version even without notifications (the guide's slow poll).
    pub poll_interval: Duration,
    /// Upper bound of the watcher's reconnect backoff.
    pub max_reconnect_backoff: Duration,
    /// What to serve while the directory is unreachable.
    pub policy: Policy,
    /// Connections used for cache misses.
    pub store_pool_size: usize,
    /// How long to wait for a new connection to the directory (the store's and the watcher's),
    /// unless the connection string sets `connect_timeout`.
    pub connect_timeout: Duration,
    /// How long a directory query (a miss, a refresh, the watcher's poll) or a wait for a pooled
    /// connection may take. Past it the directory counts as unreachable: lookups go to the
    /// [`Policy`], the watcher reconnects.
    pub query_timeout: Duration,
    /// Entries the cache holds at most (unknown entities included); past it, entries filled
    /// before the latest invalidation go first, then any.
    pub max_cached_entries: usize,
    /// Subscribe to `LISTEN shard_directory`. Turn off where LISTEN is not available (a pooler in
    /// transaction mode): the watcher then relies on the poll alone, and shards' 40001s.
    pub listen: bool,
    /// Where the watcher connects, when not where the queries go: LISTEN needs a session of its
    /// own, so with the queries going through a transaction-mode pooler, point this straight at
    /// PostgreSQL. `None`: the watcher uses the queries' connection settings.
    pub listen_config: Option<tokio_postgres::Config>,
    /// How the directory queries are sent; [`Statements::Unnamed`] behind a transaction-mode
    /// pooler that cannot carry prepared statements (the watcher's poll too when it goes there).
    pub statements: Statements,
    /// The TLS connector (feature `native-tls`) for the store's and the watcher's connections,
    /// used as their connection strings' `sslmode` asks. `None`: the platform's default, which
    /// verifies the server's certificate against the system's roots.
    #[cfg(feature = "native-tls")]
    pub tls: Option<native_tls::TlsConnector>,
    /// The shared middle cache (feature `redis`).
    #[cfg(feature = "redis")]
    pub shared_cache: Option<crate::SharedCacheConfig>,
    /// The relay (feature `redis`): the directory's changes through Redis pub/sub, from
    /// `shard-directory relay`, instead of this instance's own LISTEN connection, which it
    /// opens again only while the relay is silent.
    #[cfg(feature = "redis")]
    pub relay: Option<crate::RelayConfig>,
    /// The directory's streaming replicas (hot standbys): fills and the reads of what changed
    /// after a notification go there, in turn, so that the primary serves writes and
    /// notifications (and the slow poll). A replica's read is taken only once it has replayed
    /// the version the client knows (or was notified of) in the directory's epoch; past
    /// `replica_wait` the read goes to the primary.
    pub replicas: Vec<tokio_postgres::Config>,
    /// How long a read waits for a replica to replay the version it needs.
    pub replica_wait: Duration,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            poll_interval: Duration::from_secs(30),
            max_reconnect_backoff: Duration::from_secs(5),
            policy: Policy::ServeFromCache,
            store_pool_size: 4,
            connect_timeout: Duration::from_secs(5),
            query_timeout: Duration::from_secs(5),
            max_cached_entries: 1_000_000,
            listen: true,
            listen_config: None,
            statements: Statements::Prepared,
            #[cfg(feature = "native-tls")]
            tls: None,
            #[cfg(feature = "redis")]
            shared_cache: None,
            #[cfg(feature = "redis")]
            relay: None,
            replicas: Vec::new(),
            replica_wait: Duration::from_millis(100),
        }
    }
}

setters!(DirectoryConfig {
    poll_interval: Duration,
    max_reconnect_backoff: Duration,
    policy: Policy,
    store_pool_size: usize,
    connect_timeout: Duration,
    query_timeout: Duration,
    max_cached_entries: usize,
    listen: bool,
    statements: Statements,
    replica_wait: Duration,
});

impl DirectoryConfig {
    /// Sets `relay`.
    #[cfg(feature = "redis")]
    pub fn relay(mut self, config: crate::RelayConfig) -> Self {
        self.relay = Some(config);
        self
    }

    /// Adds a streaming replica of the directory to `replicas`.
    pub fn replica(mut self, config: tokio_postgres::Config) -> Self {
        self.replicas.push(config);
        self
    }

    /// Sets `listen_config`: where the watcher connects.
    pub fn listen_config(mut self, config: tokio_postgres::Config) -> Self {
        self.listen_config = Some(config);
        self
    }

    /// Sets `tls`: the TLS connector (e.g. one that trusts the directory's CA).
    #[cfg(feature = "native-tls")]
    pub fn tls(mut self, connector: native_tls::TlsConnector) -> Self {
        self.tls = Some(connector);
        self
    }

    /// Sets `shared_cache`.
    #[cfg(feature = "redis")]
    pub fn shared_cache(mut self, config: crate::SharedCacheConfig) -> Self {
        self.shared_cache = Some(config);
        self
    }
}

/// Called between a fill's fetch and its store into the cache (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
pub type FillHook = Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// How often one instance asks the directory to release an entity it keeps finding read-only.
const RELEASE_ASKED_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The gates of the misses in flight, by key. Gates no miss holds any more are swept out when the
/// map has doubled since the last sweep: a sweep at every new gate made a burst of N misses cost
/// N² under the lock (8,000 at once starved the runtime for over a second).
#[derive(Default)]
struct Gates {
    map: HashMap<EntityKey, Weak<tokio::sync::Mutex<()>>>,
    swept: usize,
}

impl Gates {
    fn gate(&mut self, key: &EntityKey) -> Arc<tokio::sync::Mutex<()>> {
        if let Some(gate) = self.map.get(key).and_then(Weak::upgrade) {
            return gate;
        }
        if self.map.len() >= 2 * self.swept.max(32) {
            self.map.retain(|_, gate| gate.strong_count() > 0);
            self.swept = self.map.len();
        }
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        self.map.insert(key.clone(), Arc::downgrade(&gate));
        gate
    }
}

struct Inner {
    cache: Arc<Cache>,
    watch: Arc<Watch>,
    counters: Arc<Counters>,
    store: Arc<Store>,
    policy: Policy,
    /// The misses being filled, by key: a miss for a key already being filled waits for that
    /// fill and reads what it cached (one directory query per key at a time).
    inflight: Mutex<Gates>,
    /// When this instance last asked the directory to release each entity it found read-only.
    release_asked: Mutex<HashMap<EntityKey, std::time::Instant>>,
    _watcher: AbortOnDrop,
    #[cfg(feature = "redis")]
    shared: Option<crate::shared_cache::SharedCache>,
    /// The change log's backfills, one at a time, with the generation of the log and the
    /// newest read that the directory could not list the changes since.
    #[cfg(feature = "redis")]
    backfills: tokio::sync::Mutex<Option<(u64, i64)>>,
    /// The relay's subscriber, when there is one.
    #[cfg(feature = "redis")]
    _relay: Option<AbortOnDrop>,
    #[cfg(feature = "test-hooks")]
    fill_hook: std::sync::Mutex<Option<FillHook>>,
}

/// The application's view of the shard directory. Cheap to clone; clones share one cache, one
/// watcher connection and one store pool.
///
/// ```no_run
/// # async fn demo() -> Result<(), shard_directory_client::Error> {
/// use shard_directory_client::{Directory, DirectoryConfig};
///
/// let config = "host=127.0.0.1 dbname=directory user=app".parse().unwrap();
/// let directory = Directory::connect(config, DirectoryConfig::default()).await?;
/// let entry = directory.lookup("tenant", "8842").await?;
/// println!("tenant 8842 is on {} (directory version {})", entry.shard_name, entry.directory_version);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Directory {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("version", &self.version())
            .field("connected", &self.is_connected())
            .field("entries", &self.cached_entries())
            .field("policy", &self.policy())
            .finish_non_exhaustive()
    }
}

impl Directory {
    /// Connects the store, reads the current version and starts the watcher.
    pub async fn connect(
        config: tokio_postgres::Config,
        settings: DirectoryConfig,
    ) -> Result<Directory> {
        let counters = Arc::new(Counters::default());
        let timeouts = Timeouts {
            connect: settings.connect_timeout,
            query: settings.query_timeout,
        };
        let tls = connector_of!(settings)?;
        let store = Store::new(
            config.clone(),
            settings.store_pool_size,
            timeouts,
            settings.statements,
            &tls,
            counters.clone(),
            Replicas::new(
                settings.replicas,
                settings.store_pool_size,
                timeouts,
                &tls,
                settings.replica_wait,
            )?,
        )?;
        let store = Arc::new(store);
        let now = store.current_version().await?;
        #[cfg(feature = "redis")]
        let kept = settings.shared_cache.as_ref().map_or(0, |c| c.kept_changes);
        #[cfg(not(feature = "redis"))]
        let kept = 0;
        let cache = Arc::new(Cache::keeping_changes(
            now.version,
            settings.max_cached_entries,
            kept,
        ));
        if let Some(epoch) = &now.epoch {
            cache.adopt_epoch(epoch, now.version);
        }
        let watch = Arc::new(Watch::default());
        // Straight to PostgreSQL, the watcher's own statements can be prepared.
        let (watcher_config, watcher_statements) = match settings.listen_config {
            Some(direct) => (direct, Statements::Prepared),
            None => (config, settings.statements),
        };
        #[cfg(feature = "redis")]
        let relay = match settings.relay {
            Some(config) => Some(crate::relay::Subscriber {
                client: redis::Client::open(config.url.as_str())
                    .map_err(|e| Error::Config(format!("relay: {e}")))?,
                config,
                cache: cache.clone(),
                watch: watch.clone(),
                counters: counters.clone(),
                store: store.clone(),
                connect_timeout: settings.connect_timeout,
                max_backoff: settings.max_reconnect_backoff,
                asked: std::sync::Mutex::default(),
            }),
            None => None,
        };
        #[cfg(feature = "redis")]
        let relay_silence = relay.as_ref().map(|r| r.config.silence);
        #[cfg(not(feature = "redis"))]
        let relay_silence = None;
        let watcher = Watcher {
            config: watcher_config,
            statements: watcher_statements,
            tls,
            cache: cache.clone(),
            watch: watch.clone(),
            counters: counters.clone(),
            poll_interval: settings.poll_interval,
            timeouts,
            max_backoff: settings.max_reconnect_backoff,
            listen: settings.listen,
            store: store.clone(),
            relay_silence,
        };
        #[cfg(feature = "redis")]
        let shared = settings
            .shared_cache
            .map(crate::shared_cache::SharedCache::new)
            .transpose()
            .map_err(|e| Error::Config(format!("shared cache: {e}")))?;
        let task = AbortOnDrop(tokio::spawn(watcher.run()));
        #[cfg(feature = "redis")]
        let relay = relay.map(|subscriber| AbortOnDrop(tokio::spawn(subscriber.run())));
        Ok(Directory {
            inner: Arc::new(Inner {
                cache,
                watch,
                counters,
                store,
                policy: settings.policy,
                inflight: Mutex::default(),
                release_asked: Mutex::default(),
                _watcher: task,
                #[cfg(feature = "redis")]
                shared,
                #[cfg(feature = "redis")]
                backfills: tokio::sync::Mutex::default(),
                #[cfg(feature = "redis")]
                _relay: relay,
                #[cfg(feature = "test-hooks")]
                fill_hook: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The entry for `(entity_type, entity_id)`.
    /// A hit allocates nothing: the key is only made on a miss.
    pub async fn lookup(&self, entity_type: &str, entity_id: &str) -> Result<Entry> {
        if let Some(answer) = self.lookup_cached(entity_type, entity_id) {
            return answer;
        }
        // Boxed: the miss path's state (a fill, the store's query) would otherwise make every
        // lookup's future kilobytes large, copied on a hit too.
        Box::pin(self.lookup_key(&EntityKey::new(entity_type, entity_id))).await
    }

    /// The entry for `(entity_type, entity_id)` when the cache answers without a round trip (it
    /// is current, and the watcher is there to say so), counted as a hit; `None` when a lookup
    /// would read the directory. For a caller that must not wait (an event loop), which looks
    /// up elsewhere on `None`.
    pub fn lookup_cached(&self, entity_type: &str, entity_id: &str) -> Option<Result<Entry>> {
        let borrowed = KeyRef {
            entity_type,
            entity_id,
        };
        let answer = self.current(&borrowed, KeyRef::to_owned)?;
        self.inner.counters.hit();
        Some(answer.map(|(entry, _)| entry))
    }

    /// The entry for `key`: from the cache when current, else from the store. While the watcher
    /// is reconnecting, cached entries may have missed an invalidation: lookups go to the store.
    /// Only when the store cannot be reached does the [`Policy`] decide.
    pub async fn lookup_key(&self, key: &EntityKey) -> Result<Entry> {
        Ok(self.route(key).await?.0)
    }

    /// The entry for `key` and the version a request routed by it carries: the newest version
    /// the entry is known to be current at (it may be newer than the version it was read at).
    pub(crate) async fn route(&self, key: &EntityKey) -> Result<(Entry, i64)> {
        if let Some(answer) = self.current(key, EntityKey::clone) {
            self.inner.counters.hit();
            return answer;
        }
        self.inner.counters.miss();
        let gate = self.gate(key);
        let _turn = gate.lock().await;
        // The miss this one waited for may have filled it.
        if let Some(answer) = self.current(key, EntityKey::clone) {
            return answer;
        }
        let cached = match self.inner.cache.get(key) {
            Lookup::Current { entry, .. } => entry.map(Cached::Unchanged),
            Lookup::Stale(e) => Some(Cached::Flushed(e)),
            Lookup::Changed(e) => Some(Cached::Changed(e)),
            Lookup::Absent => None,
        };
        let stamped = |e: Entry| (e, e.directory_version);
        match self.fill(key).await {
            Err(e) if e.is_directory_outage() => self.degraded(key, cached, e).map(stamped),
            other => other.map(stamped),
        }
    }

    /// The cached answer for `key` and its stamp, when it is current and the watcher is there to
    /// say so. (`owned` makes the key an error names.)
    fn current<Q>(
        &self,
        key: &Q,
        owned: impl FnOnce(&Q) -> EntityKey,
    ) -> Option<Result<(Entry, i64)>>
    where
        Q: AsKeyRef,
    {
        if !self.inner.watch.connected() {
            return None;
        }
        match self.inner.cache.get(key) {
            Lookup::Current {
                entry: Some(e),
                stamp,
            } => Some(Ok((e, stamp))),
            Lookup::Current { entry: None, .. } => Some(Err(Error::UnknownEntity(owned(key)))),
            Lookup::Stale(_) | Lookup::Changed(_) | Lookup::Absent => None,
        }
    }

    /// The gate misses of `key` pass one at a time.
    fn gate(&self, key: &EntityKey) -> Arc<tokio::sync::Mutex<()>> {
        self.inner.inflight.lock().expect("inflight lock").gate(key)
    }

    /// The store could not be reached (`cause`): the policy decides whether `cached`, the entry
    /// of `key`, is served.
    pub(crate) fn degraded(
        &self,
        key: &EntityKey,
        cached: Option<Cached>,
        cause: Error,
    ) -> Result<Entry> {
        let entry = self.inner.policy.degraded(key, cached, || cause)?;
        self.inner.counters.served_stale();
        tracing::warn!(entity = %key, version = entry.directory_version, "directory unreachable: serving the cached entry");
        Ok(entry)
    }

    /// Reads the entry from the store until a read is at least as new as every invalidation heard
    /// meanwhile, and caches it. A read below the version known when it began is the directory
    /// itself going back (every version known was read from it before): the client adopts it.
    /// One below a version learned while it ran is a race: it reads again.
    async fn fill(&self, key: &EntityKey) -> Result<Entry> {
        let inner = &self.inner;
        loop {
            let known = inner.cache.version();
            #[cfg(feature = "redis")]
            if let Some(shared) = &inner.shared {
                if let Some(entry) = self.shared_fill(shared, key).await {
                    return Ok(entry);
                }
            }
            let history = inner.cache.history();
            let trust_notified = !inner.cache.went_back();
            let Fetched(entry, at, read_in, _) = inner
                .store
                .fetch(key, known, history.as_deref(), trust_notified)
                .await?;
            #[cfg(feature = "test-hooks")]
            {
                let hook = inner.fill_hook.lock().expect("hook lock").clone();
                if let Some(hook) = hook {
                    hook().await;
                }
            }
            // Another history: the version known says nothing of this read's.
            let new_history = read_in
                .as_deref()
                .is_some_and(|epoch| adopt_epoch(&inner.cache, &inner.counters, epoch, at));
            if !new_history && at < known && !adopt_lower(&inner.cache, &inner.counters, known, at)
            {
                tracing::debug!(entity = %key, read_at = at, known, "the known version moved during a read below it; reading again");
                continue;
            }
            // A fetch can see a version the watcher has not announced yet: its entry is
            // current as read, and the watcher reads what else changed.
            if at > inner.cache.version() {
                inner.watch.nudge();
            }
            let Some(entry) = entry else {
                inner.cache.fill_in(key, None, at, read_in.as_deref());
                return Err(Error::UnknownEntity(key.clone()));
            };
            if inner
                .cache
                .fill_in(key, Some(entry), at, read_in.as_deref())
            {
                #[cfg(feature = "redis")]
                if let Some(shared) = &inner.shared {
                    shared.put(key, &entry, read_in.as_deref()).await;
                }
                return Ok(entry);
            }
            tracing::debug!(entity = %key, read_at = at, "fill raced an invalidation; reading again");
        }
    }

    /// The entry another instance stored in the shared cache, when the cache takes it as
    /// current ([`Cache::fill_shared`]).
    #[cfg(feature = "redis")]
    async fn shared_fill(
        &self,
        shared: &crate::shared_cache::SharedCache,
        key: &EntityKey,
    ) -> Option<Entry> {
        let inner = &self.inner;
        let history = inner.cache.history();
        let history = history.as_deref();
        let found = shared.get(key, history).await;
        let mut stored = false;
        if let Some(entry) = found {
            let mut backfilled = false;
            stored = loop {
                match inner.cache.fill_shared(key, entry, history) {
                    Shared::Stored => break true,
                    Shared::Refused => break false,
                    Shared::BeyondLog { generation } => {
                        if backfilled || !self.backfill(shared, generation, entry).await {
                            break false;
                        }
                        backfilled = true;
                    }
                }
            };
        }
        inner.counters.shared(stored);
        let entry = found.filter(|_| stored)?;
        if entry.directory_version > inner.cache.version() {
            inner.watch.nudge();
        }
        Some(entry)
    }

    /// Makes the change log reach back to `entry`'s read with a `changes_since()` read, so that
    /// it and every other shared entry read since can be checked: a fresh instance meets entries
    /// of random ages, so it makes one per new oldest read (about ln n for n misses). One at a
    /// time, and none for a read as old as one the directory could not list the changes since
    /// (history purged, or more than the log keeps). Returns whether the log reaches back that
    /// far now.
    #[cfg(feature = "redis")]
    async fn backfill(
        &self,
        shared: &crate::shared_cache::SharedCache,
        generation: u64,
        entry: Entry,
    ) -> bool {
        let inner = &self.inner;
        let read = entry.directory_version;
        let kept = shared.config().kept_changes;
        let Ok(mut beyond) = inner.backfills.try_lock() else {
            return false;
        };
        if kept == 0 || beyond.is_some_and(|(g, at)| g == generation && read <= at) {
            return false;
        }
        let changes = match inner.store.backfill(read, kept).await {
            Ok(changes) => changes,
            Err(e) => {
                tracing::debug!(error = %e, since = read, "the change log's backfill failed");
                return false;
            }
        };
        if let Some(changed) = changes.changed {
            let epoch = changes.epoch.as_deref();
            return inner
                .cache
                .backfill(generation, epoch, read, changes.version, &changed);
        }
        *beyond = Some((generation, read));
        false
    }

    /// Records what a shard said when it refused a transaction for a moved entity: the entity is
    /// active on `moved_to` as of `version`. Lets the retry go straight there, without a
    /// directory round trip. The learned entry is stamped with the fence's version, not this
    /// client's newest: the entity may have moved on from `moved_to` since, and only a request
    /// carrying `version` can be refused there for that. When the client already knows a newer
    /// version, the fill is refused and the retry reads the directory.
    pub(crate) fn learn_moved(&self, key: &EntityKey, entry: &Entry, moved_to: &str, version: i64) {
        self.inner.watch.nudge();
        let learned = Entry {
            shard_name: Name::new(moved_to),
            target_shard: None,
            state: State::Active,
            version,
            directory_version: version,
            ..*entry
        };
        self.inner.cache.fill(key, Some(learned), version);
    }

    /// Where `shard` is, from the directory's registry (`shards.conninfo`), if it says.
    pub async fn shard_conninfo(&self, shard: &str) -> Result<Option<String>> {
        self.inner.store.conninfo(shard).await
    }

    /// Re-reads the global version (after a shard said this client is stale).
    pub async fn refresh(&self) -> Result<i64> {
        let inner = &self.inner;
        let changes = inner.store.changes_since(inner.cache.version()).await?;
        inner
            .watch
            .learned(&inner.cache, &inner.counters, &changes, false);
        Ok(inner.cache.version())
    }

    /// The directory version this client knows.
    pub fn version(&self) -> i64 {
        self.inner.cache.version()
    }

    /// Waits until this client knows directory version `version` or a later one: after a
    /// directory change the application made itself (whose statement returned the version),
    /// before routing by it. Bound it with a timeout: a version the directory never reaches is
    /// never known.
    pub async fn wait_for_version(&self, version: i64) {
        let mut known = self.inner.cache.subscribe();
        // The sender lives as long as the cache this Directory holds: never closed here.
        let _ = known.wait_for(|v| *v >= version).await;
    }

    /// The directory version this client knows, as it changes (a `tokio::sync::watch`).
    pub fn version_changes(&self) -> tokio::sync::watch::Receiver<i64> {
        self.inner.cache.subscribe()
    }

    /// Whether the watcher's connection is up.
    pub fn is_connected(&self) -> bool {
        self.inner.watch.connected()
    }

    /// Whether notifications reach the watcher: it heard its own probe when it connected. False
    /// with `listen` off, and behind a transaction-mode pooler (the watcher then polls every
    /// second, and says so in a WARN).
    pub fn is_listening(&self) -> bool {
        self.inner.watch.listening()
    }

    /// When the watcher last heard from the directory (a notification or a poll).
    pub fn last_heard(&self) -> Option<SystemTime> {
        self.inner.watch.last_heard()
    }

    /// When the cache was last invalidated.
    pub fn last_invalidation(&self) -> Option<SystemTime> {
        self.inner.watch.last_invalidation()
    }

    /// How many entries the cache holds (current or not).
    pub fn cached_entries(&self) -> usize {
        self.inner.cache.len()
    }

    /// The policy applied while the directory is unreachable.
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// This client's counters.
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    /// For an entity found read-only: asks the directory (at most once a second per entity) to
    /// release it if its freeze's lease has ended with no cutover, as when its mover vanished
    /// mid-freeze; learns the release when there was one. Returns whether it was released.
    pub(crate) async fn release_if_expired(&self, key: &EntityKey) -> bool {
        let now = std::time::Instant::now();
        {
            let mut asked = self.inner.release_asked.lock().expect("release lock");
            if asked
                .get(key)
                .is_some_and(|t| now.duration_since(*t) < RELEASE_ASKED_EVERY)
            {
                return false;
            }
            asked.retain(|_, t| now.duration_since(*t) < RELEASE_ASKED_EVERY);
            asked.insert(key.clone(), now);
        }
        match self.inner.store.release_expired_freeze(key).await {
            Ok(Some(version)) => {
                tracing::warn!(entity = %key, version, "released an entity whose freeze's lease \
                    ended before its cutover (its mover stopped)");
                self.refresh().await.is_ok()
            }
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(entity = %key, error = %e, "could not ask to release a freeze");
                false
            }
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Runs `hook` between every fill's fetch and its store into the cache.
    #[cfg(feature = "test-hooks")]
    pub fn set_fill_hook(&self, hook: Option<FillHook>) {
        *self.inner.fill_hook.lock().expect("hook lock") = hook;
    }
}
