//! `Router`: runs a caller's closure as one transaction on the shard the directory names,
//! stamped with the client's directory version, and re-runs it when the shard says the route
//! was stale.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{IsolationLevel, Transaction};
use tracing::Instrument;

use crate::directory::Directory;
use crate::entry::{EntityKey, Entry, State};
use crate::error::{Error, Result};
use crate::policy::Cached;
use crate::pool::{self, Connector, Lent, Timeouts};
use crate::rejection::Rejection;
use crate::statements::Statements;

/// Connection settings for one shard. The password (if any) lives in `config` and is never logged.
#[derive(Clone)]
#[non_exhaustive]
pub struct ShardConfig {
    /// The name the directory uses for the shard (`shards.shard_name`).
    pub name: String,
    /// How to connect to it.
    pub config: tokio_postgres::Config,
    /// Connections in its pool.
    pub pool_size: usize,
    /// How long to wait for a new connection (unless the connection string sets
    /// `connect_timeout`); past it, `Error::ShardUnavailable`. A wait for a free one in the pool,
    /// and the statements, are bounded by the [`RetryPolicy`]'s deadline.
    pub connect_timeout: Duration,
    /// How the stamp is sent; [`Statements::Unnamed`] behind a transaction-mode pooler that
    /// cannot carry prepared statements.
    pub statements: Statements,
    /// The TLS connector (feature `native-tls`), used as the connection string's `sslmode`
    /// asks. `None`: the platform's default, which verifies the server's certificate against
    /// the system's roots.
    #[cfg(feature = "native-tls")]
    pub tls: Option<native_tls::TlsConnector>,
}

impl ShardConfig {
    /// A shard with the default pool size (8).
    ///
    /// ```
    /// use shard_directory_client::ShardConfig;
    /// let config = "host=10.0.0.1 dbname=app user=app password=secret".parse().unwrap();
    /// let shard = ShardConfig::new("shard_1", config);
    /// assert!(!format!("{shard:?}").contains("secret"), "passwords are never printed");
    /// ```
    pub fn new(name: impl Into<String>, config: tokio_postgres::Config) -> Self {
        ShardConfig {
            name: name.into(),
            config,
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            statements: Statements::Prepared,
            #[cfg(feature = "native-tls")]
            tls: None,
        }
    }
}

impl std::fmt::Debug for ShardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardConfig")
            .field("name", &self.name)
            .field("hosts", &self.config.get_hosts())
            .field("ports", &self.config.get_ports())
            .field("dbname", &self.config.get_dbname())
            .field("user", &self.config.get_user())
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("statements", &self.statements)
            .finish_non_exhaustive()
    }
}

/// How patiently a refused transaction is re-run: by time, not by count, so that a write waits
/// out a cutover's freeze (the mover's default `--max-freeze` is 10 s) instead of failing in the
/// middle of it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// How long after its first attempt a transaction may still be re-run (after a 40001, or
    /// while its entity is `read_only`).
    pub deadline: Duration,
    /// Backoff before every re-run (but the first after a `moved` refusal, which says where to
    /// go) and between looks at a `read_only` entry; doubles each time, with jitter.
    pub base_backoff: Duration,
    /// Upper bound of the backoff.
    pub max_backoff: Duration,
    /// How long one attempt may take: the wait for a shard connection, BEGIN, the stamp, the
    /// closure's statements and COMMIT. A re-run also ends by the deadline; the first attempt
    /// always has this long (with a zero deadline, the one attempt there is).
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            deadline: Duration::from_secs(15),
            base_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(500),
            attempt_timeout: Duration::from_secs(15),
        }
    }
}

setters!(RetryPolicy {
    deadline: Duration,
    base_backoff: Duration,
    max_backoff: Duration,
    attempt_timeout: Duration,
});

setters!(ShardConfig {
    pool_size: usize,
    connect_timeout: Duration,
    statements: Statements,
});

#[cfg(feature = "native-tls")]
impl ShardConfig {
    /// Sets `tls`: the TLS connector (e.g. one that trusts the shards' CA).
    pub fn tls(mut self, connector: native_tls::TlsConnector) -> Self {
        self.tls = Some(connector);
        self
    }
}

impl RetryPolicy {
    fn backoff(&self, attempt: u32) -> Duration {
        crate::backoff::jittered(self.base_backoff, attempt, self.max_backoff)
    }
}

/// What a read returns: one result, or, while the entity is `migrating`, one from each shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reads<T> {
    /// The entity is on one shard.
    One(T),
    /// The entity is `migrating`: the source's result and the target's.
    Both {
        /// From the shard that still owns the entity.
        source: T,
        /// From the shard it is being copied to.
        target: T,
    },
    /// The entity is `migrating` and its target could not be reached: the source's result
    /// (the source still owns every row of the entity), and why the target's is missing.
    SourceOnly {
        /// From the shard that still owns the entity.
        source: T,
        /// What reaching the target said.
        target_unavailable: String,
    },
}

impl<T> Reads<T> {
    /// Combines the two results of a dual read (or returns the single one).
    ///
    /// ```
    /// use shard_directory_client::Reads;
    /// let rows = Reads::Both { source: vec![1, 2], target: vec![2, 3] };
    /// let merged = rows.merge(|mut a, b| { a.extend(b); a.sort(); a.dedup(); a });
    /// assert_eq!(merged, [1, 2, 3]);
    /// ```
    pub fn merge(self, f: impl FnOnce(T, T) -> T) -> T {
        match self {
            Reads::One(t) | Reads::SourceOnly { source: t, .. } => t,
            Reads::Both { source, target } => f(source, target),
        }
    }
}

/// The client's version and entity for the shard's check (the protocol's settings), set for
/// this transaction only. `$4`, the milliseconds the attempt has left, bounds its statements and
/// any idle time in the transaction (a stricter `statement_timeout` of the session's stays).
fn settings() -> String {
    use shard_directory_protocol::setting::{DIRECTORY_VERSION, ENTITY_ID, ENTITY_TYPE};
    format!(
        "set_config('{DIRECTORY_VERSION}', $1, true), \
         set_config('{ENTITY_TYPE}', $2, true), set_config('{ENTITY_ID}', $3, true), \
         set_config('statement_timeout', CASE WHEN current_setting('statement_timeout') <> '0' \
             AND current_setting('statement_timeout')::interval <= ($4 || ' ms')::interval \
             THEN current_setting('statement_timeout') ELSE $4 END, true), \
         set_config('idle_in_transaction_session_timeout', $4, true)"
    )
}

/// The settings, and the check `check` run on them in the same statement (the subquery,
/// volatile, so not flattened, sets them first).
fn stamp_and(check: &str) -> String {
    format!("SELECT {check} FROM (SELECT {}) stamp", settings())
}

/// An unchecked read's stamp: the settings alone.
static STAMP: LazyLock<String> = LazyLock::new(|| format!("SELECT {}", settings()));

/// A write's stamp also runs the check, so a stale route is refused before the closure runs
/// (whatever error type the closure returns); the check's lock then holds every fence of the
/// shard back until this transaction ends.
static STAMP_AND_CHECK: LazyLock<String> =
    LazyLock::new(|| stamp_and("shard_directory.assert_directory_version()"));

/// A read's: the check for a reader, which a frozen entity passes (its source holds every row
/// until the cutover) and a moved or stale one does not.
static STAMP_AND_READ_CHECK: LazyLock<String> =
    LazyLock::new(|| stamp_and("shard_directory.assert_directory_version(true)"));

/// How a routed transaction begins: its isolation level and whether it is read-only (set at
/// BEGIN, before the stamp, as `SET TRANSACTION` would have to be).
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct TxOptions {
    /// `None`: the server's default.
    pub isolation: Option<IsolationLevel>,
    /// `BEGIN READ ONLY`.
    pub read_only: bool,
}

impl TxOptions {
    /// With this isolation level.
    pub fn isolation(mut self, level: IsolationLevel) -> Self {
        self.isolation = Some(level);
        self
    }

    /// Read-only.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
}

/// Routes work to shards.
///
/// ```no_run
/// # async fn demo(directory: shard_directory_client::Directory) -> Result<(), shard_directory_client::Error> {
/// use shard_directory_client::{EntityKey, Router, ShardConfig};
///
/// let router = Router::new(directory, [
///     ShardConfig::new("shard_1", "host=10.0.0.1 dbname=app user=app".parse().unwrap()),
///     ShardConfig::new("shard_2", "host=10.0.0.2 dbname=app user=app".parse().unwrap()),
/// ])?;
/// let tenant = EntityKey::new("tenant", "8842");
/// // The closure returns your own error type (here this crate's); an `Err` rolls back.
/// router
///     .run(&tenant, async |tx| {
///         tx.execute("INSERT INTO orders (tenant_id, item) VALUES ($1, $2)", &[&"8842", &"book"]).await?;
///         Ok::<_, shard_directory_client::Error>(())
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub struct Router {
    directory: Directory,
    shards: RwLock<HashMap<String, Shard>>,
    /// Set by [`Router::learn_shards`]: how to connect to a shard this router was not given.
    learn: Option<ShardConfig>,
    retry: RetryPolicy,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shards: Vec<String> = self
            .shards
            .read()
            .expect("shards lock")
            .keys()
            .cloned()
            .collect();
        shards.sort();
        f.debug_struct("Router")
            .field("directory", &self.directory)
            .field("shards", &shards)
            .field("learns_shards", &self.learn.is_some())
            .field("retry", &self.retry)
            .finish()
    }
}

impl Router {
    /// A router over `shards`, looking entries up in `directory`. Pools connect lazily.
    pub fn new(
        directory: Directory,
        shards: impl IntoIterator<Item = ShardConfig>,
    ) -> Result<Router> {
        let shards = shards
            .into_iter()
            .map(|config| {
                Ok((
                    config.name.clone(),
                    Shard::new(&config.name, config.clone())?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Router {
            directory,
            shards: RwLock::new(shards),
            learn: None,
            retry: RetryPolicy::default(),
        })
    }

    /// Routes to `name` through a pool the application already has; `statements` says how the
    /// stamp is sent on its connections.
    pub fn with_pool(self, name: impl Into<String>, pool: Pool, statements: Statements) -> Self {
        self.shards.write().expect("shards lock").insert(
            name.into(),
            Shard {
                pool,
                statements,
                read_check: Arc::new(AtomicBool::new(true)),
                tls: Connector::platform(),
                connect_timeout: Duration::from_secs(5),
            },
        );
        self
    }

    /// Shards this router was not given (one added after it started, that a tenant has just
    /// moved to) are learned from the directory's registry: `shards.conninfo` says where the
    /// shard is; `credentials` says who connects (its user and password replace the
    /// conninfo's), with its pool size and timeouts. Without it, such a shard is
    /// [`Error::UnknownShard`].
    pub fn learn_shards(mut self, credentials: ShardConfig) -> Self {
        self.learn = Some(credentials);
        self
    }

    /// The pool for `shard`, learning it from the registry when allowed.
    async fn shard(&self, shard: &str, entity: &EntityKey) -> Result<Shard> {
        if let Some(known) = self.shards.read().expect("shards lock").get(shard) {
            return Ok(known.clone());
        }
        let unknown = || Error::UnknownShard {
            entity: entity.clone(),
            shard: shard.to_owned(),
        };
        let Some(template) = &self.learn else {
            return Err(unknown());
        };
        let Some(conninfo) = self.directory.shard_conninfo(shard).await? else {
            return Err(unknown());
        };
        let mut config: tokio_postgres::Config = conninfo
            .parse()
            .map_err(|e| Error::Config(format!("shards.conninfo of \"{shard}\": {e}")))?;
        if let Some(user) = template.config.get_user() {
            config.user(user);
        }
        if let Some(password) = template.config.get_password() {
            config.password(password);
        }
        let learned = Shard::new(
            shard,
            ShardConfig {
                config,
                ..template.clone()
            },
        )?;
        tracing::info!(shard, "learned a shard from the directory's registry");
        Ok(self
            .shards
            .write()
            .expect("shards lock")
            .entry(shard.to_owned())
            .or_insert(learned)
            .clone())
    }

    /// Replaces the default [`RetryPolicy`].
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The directory this router looks entries up in.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// Runs `f` as one read-write transaction on the shard that owns `key`. The transaction first
    /// sets `app.directory_version`, `app.entity_type` and `app.entity_id` and runs the shard's
    /// check (one statement); when the shard refuses it with 40001 (there, or in the closure) the
    /// whole closure is re-run on a refreshed route until [`RetryPolicy::deadline`]. While the
    /// entity is `read_only` no round trip is made to its shard: the write waits (with backoff)
    /// for the freeze to end, asking the directory once a second to end a freeze whose lease has
    /// run out (its mover vanished), and past the deadline fails with [`Error::ReadOnly`]. The closure returns the
    /// caller's own error type; an `Err` rolls the transaction back and is returned as it is.
    ///
    /// The future is `Send` (it can be spawned) when the closure owns what it uses
    /// (`async move |tx| ...`): rustc cannot yet prove it for a closure that borrows from its
    /// surroundings (rust-lang/rust#134997).
    pub async fn run<T, E, F>(&self, key: &EntityKey, f: F) -> Result<T, E>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: From<Error> + 'static,
    {
        self.run_with(key, TxOptions::default(), f).await
    }

    /// [`Router::run`] with an isolation level, or read-only.
    pub async fn run_with<T, E, F>(
        &self,
        key: &EntityKey,
        options: TxOptions,
        mut f: F,
    ) -> Result<T, E>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: From<Error> + 'static,
    {
        let reads = self.with_retries(key, Mode::Write(options), &mut f).await?;
        Ok(reads.merge(|source, _| source))
    }

    /// Runs `f` as a read-only transaction, checked as a write is: a shard that has given the
    /// entity away (or is ahead of this client's directory) refuses it, and it is repaired and
    /// re-run like a write; a frozen entity is read where it is. While the entity is `migrating`
    /// it runs on both the source and the target and returns both results; otherwise on the
    /// owning shard.
    pub async fn read<T, E, F>(&self, key: &EntityKey, mut f: F) -> Result<Reads<T>, E>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: From<Error> + 'static,
    {
        self.with_retries(key, Mode::Read { checked: true }, &mut f)
            .await
    }

    /// [`Router::read`] without the shard's check, for a caller that accepts a read from a shard
    /// that may have given the entity away (an empty answer from the old shard after a cutover
    /// this client has not heard of yet).
    pub async fn read_unchecked<T, E, F>(&self, key: &EntityKey, mut f: F) -> Result<Reads<T>, E>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: From<Error> + 'static,
    {
        self.with_retries(key, Mode::Read { checked: false }, &mut f)
            .await
    }

    /// One attempt of `mode` at the route `entry` gives, stamped with `version`. (A method, not a closure: an async
    /// closure borrowing `&self` would make the caller's future `Send` for one lifetime only.)
    /// `left`: the time the attempt has (its pool waits and its statements are bounded by it);
    /// `at`: where it is, for the error that says so if the time runs out.
    #[allow(clippy::too_many_arguments)]
    async fn once<T, E, F>(
        &self,
        key: &EntityKey,
        entry: &Entry,
        version: i64,
        mode: Mode,
        left: Duration,
        at: &Progress,
        f: &mut F,
    ) -> Result<Reads<T>, Attempt<E>>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: 'static,
    {
        let shard = &entry.shard_name;
        let bound = Bound { left, at };
        let stamped = |options, sql| Stamp {
            key,
            version,
            options,
            sql,
        };
        match mode {
            Mode::Write(options) => {
                if entry.state == State::ReadOnly && !options.read_only {
                    return Err(Attempt::ReadOnly);
                }
                let one = self
                    .attempt(shard, &stamped(options, &STAMP_AND_CHECK), &bound, f)
                    .await?;
                Ok(Reads::One(one))
            }
            Mode::Read { checked } => {
                let options = TxOptions::default().read_only();
                let sql: &'static str = if checked {
                    &STAMP_AND_READ_CHECK
                } else {
                    &STAMP
                };
                let stamp = stamped(options, sql);
                let source = self.attempt(shard, &stamp, &bound, f).await?;
                let (State::Migrating, Some(target)) = (&entry.state, &entry.target_shard) else {
                    return Ok(Reads::One(source));
                };
                match self.attempt(target, &stamp, &bound, f).await {
                    Ok(target) => Ok(Reads::Both { source, target }),
                    // The source still owns every row: its answer stands without the target's.
                    Err(Attempt::Fatal(e)) if e.is_shard_unreachable() => {
                        tracing::warn!(entity = %key, shard = %target, error = %e,
                            "the target of a migrating entity could not be read; returning the source's answer");
                        Ok(Reads::SourceOnly {
                            source,
                            target_unavailable: e.to_string(),
                        })
                    }
                    Err(other) => Err(other),
                }
            }
        }
    }

    async fn with_retries<T, E, F>(
        &self,
        key: &EntityKey,
        mode: Mode,
        f: &mut F,
    ) -> Result<Reads<T>, E>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: From<Error> + 'static,
    {
        let started = Instant::now();
        let mut attempt = 0;
        let span = tracing::info_span!(
            "shard_directory.route",
            entity = %key,
            attempt = tracing::field::Empty,
            shard = tracing::field::Empty,
            version = tracing::field::Empty,
        );
        loop {
            attempt += 1;
            span.record("attempt", attempt);
            let (entry, version) = self.directory.route(key).instrument(span.clone()).await?;
            span.record("shard", tracing::field::display(&entry.shard_name));
            span.record("version", version);
            let backoff = self.retry.backoff(attempt);
            let out_of_time = started.elapsed() + backoff > self.retry.deadline;
            let counters = self.directory.counters();
            // Every attempt, the pool wait included, is bounded (a re-run by the deadline too);
            // one still running then is dropped, and its statement cancelled.
            let left = match attempt {
                1 => self.retry.attempt_timeout,
                _ => (self.retry.deadline.saturating_sub(started.elapsed()))
                    .min(self.retry.attempt_timeout),
            };
            let at = Progress::default();
            let once = self.once(key, &entry, version, mode, left, &at, f);
            let outcome = match tokio::time::timeout(left, once.instrument(span.clone())).await {
                Ok(outcome) => outcome,
                Err(_) => return Err(at.timed_out(left).into()),
            };
            let (rejection, source) = match outcome {
                Ok(t) => return Ok(t),
                Err(Attempt::Fatal(e)) => return Err(e.into()),
                Err(Attempt::Caller(e)) => return Err(e),
                Err(Attempt::Again) => continue,
                Err(Attempt::ReadOnly) if out_of_time => {
                    tracing::warn!(entity = %key, attempts = attempt, "gave up waiting for a cutover to end");
                    return Err(Error::ReadOnly(key.clone()).into());
                }
                Err(Attempt::ReadOnly) => {
                    counters.retried();
                    // Not only the cached state: the cutover may have committed while this
                    // client was not told (no LISTEN behind a pooler). And a freeze whose mover
                    // vanished ends with its lease: the directory is asked to release it.
                    if !self.directory.release_if_expired(key).await {
                        tokio::time::sleep(backoff).await;
                        self.refresh_or_degrade(key, &entry).await?;
                    }
                    continue;
                }
                Err(Attempt::Refused(rejection, source)) => (rejection, source),
            };
            counters.rejected(rejection.reason());
            tracing::debug!(entity = %key, %rejection, attempt, "shard refused the transaction");
            let give_up = |rejection| match source {
                Refusal::Ours(source) => Error::Rejected {
                    entity: key.clone(),
                    attempts: attempt,
                    rejection,
                    source,
                }
                .into(),
                Refusal::Caller(e) => e,
            };
            if out_of_time || matches!(rejection, Rejection::Other(_)) {
                tracing::warn!(entity = %key, %rejection, attempts = attempt, "shard kept refusing the transaction; giving up");
                return Err(give_up(rejection));
            }
            counters.retried();
            match &rejection {
                Rejection::Moved { moved_to, version } if self.can_route_to(moved_to) => {
                    self.directory.learn_moved(key, &entry, moved_to, *version);
                    // The refusal said where to go: the first time, straight there.
                    if attempt == 1 {
                        continue;
                    }
                }
                // A shard this router cannot reach (retired, or not learned yet): the
                // directory says where the entity is, not the refusal.
                Rejection::Moved { .. } | Rejection::Stale { .. } | Rejection::Missing => {
                    let refreshed = self.refresh_or_degrade(key, &entry).await?;
                    // A minimum the directory has not reached: no refresh cures it (a failover
                    // that lost the directory's last changes, a minimum raised by hand).
                    if let (
                        true,
                        Rejection::Stale {
                            minimum: Some(minimum),
                        },
                    ) = (refreshed, &rejection)
                    {
                        let (minimum, known) = (*minimum, self.directory.version());
                        if known < minimum {
                            return Err(Error::DirectoryBehind {
                                entity: key.clone(),
                                shard: entry.shard_name.to_string(),
                                minimum,
                                directory_version: known,
                            }
                            .into());
                        }
                    }
                }
                Rejection::Frozen | Rejection::Serialization | Rejection::Other(_) => {}
            }
            // The refresh took its time: an attempt that could not end by the deadline is not
            // begun, and the refusal says why.
            if started.elapsed() + backoff >= self.retry.deadline {
                tracing::warn!(entity = %key, %rejection, attempts = attempt, "shard kept refusing the transaction; giving up");
                return Err(give_up(rejection));
            }
            tokio::time::sleep(backoff).await;
        }
    }

    /// Reads what changed in the directory (true); when it cannot be reached, the outage policy
    /// decides, as for a lookup (FailClosed gives up; ServeFromCache goes on with the cached
    /// route: false).
    async fn refresh_or_degrade(&self, key: &EntityKey, entry: &Entry) -> Result<bool> {
        match self.directory.refresh().await {
            Ok(_) => Ok(true),
            Err(e) if e.is_directory_outage() => {
                tracing::debug!(entity = %key, error = %e, "refresh failed during a retry");
                self.directory
                    .degraded(key, Some(Cached::Unchanged(*entry)), e)
                    .map(|_| false)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether this router has, or can learn, a pool for `shard`.
    fn can_route_to(&self, shard: &str) -> bool {
        self.learn.is_some() || self.shards.read().expect("shards lock").contains_key(shard)
    }

    /// One transaction on `shard`, begun and stamped as `stamp` says, within `bound`: the wait
    /// for a pooled connection, and every statement on the server (`statement_timeout`, and
    /// `idle_in_transaction_session_timeout` for a caller that stops in the middle), end by the
    /// deadline; an attempt dropped before it ends has its statement cancelled ([`Lent`]), so
    /// nothing it began holds the shard after it. An `Err` from `f` rolls it back.
    async fn attempt<T, E, F>(
        &self,
        shard: &str,
        stamp: &Stamp<'_>,
        bound: &Bound<'_>,
        f: &mut F,
    ) -> Result<T, Attempt<E>>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: 'static,
    {
        bound.at.step(shard, "connect");
        let routed = self.shard(shard, stamp.key).await.map_err(Attempt::Fatal)?;
        // A pool of the application's own may have no wait bound (nor the runtime one needs):
        // the attempt's bound covers it.
        let mut timeouts = routed.pool.timeouts();
        if timeouts.wait.is_some() {
            timeouts.wait = Some(bound.left);
        }
        let client = routed.pool.timeout_get(&timeouts).await.map_err(|source| {
            Attempt::Fatal(Error::ShardUnavailable {
                shard: shard.to_owned(),
                source,
            })
        })?;
        let mut lent = Lent::new(client, routed.tls.clone(), routed.connect_timeout);
        let ended = self
            .transact(shard, &routed, &mut lent, stamp, bound, f)
            .await;
        lent.give_back();
        ended
    }

    /// The transaction of [`Router::attempt`] on `client`, a connection of `routed`.
    async fn transact<T, E, F>(
        &self,
        shard: &str,
        routed: &Shard,
        client: &mut deadpool_postgres::Object,
        &Stamp {
            key,
            version,
            options,
            sql: stamp,
        }: &Stamp<'_>,
        bound: &Bound<'_>,
        f: &mut F,
    ) -> Result<T, Attempt<E>>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: 'static,
    {
        let Shard {
            statements,
            read_check,
            ..
        } = routed;
        bound.at.step(shard, "begin");
        let mut begin = client.build_transaction().read_only(options.read_only);
        if let Some(level) = options.isolation {
            begin = begin.isolation_level(level);
        }
        let tx = begin
            .start()
            .await
            .map_err(|e| Attempt::db(shard, "begin", e))?;
        // One round trip: prepared once per connection, or unnamed.
        bound.at.step(shard, "stamp");
        let version = version.to_string();
        let left = bound.left.as_millis().max(1).to_string();
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&version, Type::TEXT),
            (&key.entity_type, Type::TEXT),
            (&key.entity_id, Type::TEXT),
            (&left, Type::TEXT),
        ];
        // A shard whose extension predates the read check: read it unchecked, saying so once.
        let stamp = if stamp == *STAMP_AND_READ_CHECK && !read_check.load(Ordering::Relaxed) {
            &STAMP
        } else {
            stamp
        };
        let stamped = statements.query(&tx, &*tx, stamp, params).await;
        match stamped {
            Err(e)
                if stamp == *STAMP_AND_READ_CHECK
                    && e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) =>
            {
                tracing::warn!(
                    shard,
                    "the shard's shard_directory has no check for reads \
                    (ALTER EXTENSION shard_directory UPDATE there): its reads go unchecked"
                );
                read_check.store(false, Ordering::Relaxed);
                return Err(Attempt::Again);
            }
            stamped => stamped.map_err(|e| Attempt::db(shard, "stamp", e))?,
        };
        bound.at.step(shard, "the caller's statements");
        match f(&tx).await {
            Ok(out) => {
                bound.at.step(shard, "commit");
                tx.commit()
                    .await
                    .map_err(|e| Attempt::db(shard, "commit", e))?;
                Ok(out)
            }
            Err(e) => {
                // Best effort: a broken connection rolls back by itself.
                let _ = tx.rollback().await;
                Err(Attempt::caller(e))
            }
        }
    }
}

/// What a routed transaction is stamped with, and how it begins.
struct Stamp<'a> {
    key: &'a EntityKey,
    version: i64,
    options: TxOptions,
    /// The stamp's statement (it runs the check, or not).
    sql: &'static str,
}

/// The time an attempt has, and where it is in it.
struct Bound<'a> {
    left: Duration,
    at: &'a Progress,
}

/// Where an attempt is (shard and step), for the error that says so when its time runs out.
#[derive(Default)]
struct Progress(std::sync::Mutex<Option<(String, &'static str)>>);

impl Progress {
    fn step(&self, shard: &str, step: &'static str) {
        *self.0.lock().expect("progress lock") = Some((shard.to_owned(), step));
    }

    fn timed_out(&self, after: Duration) -> Error {
        let at = self.0.lock().expect("progress lock").clone();
        let (shard, step) = at.unwrap_or_else(|| ("?".to_owned(), "routing"));
        Error::ShardTimeout { shard, step, after }
    }
}

/// A shard the router can reach.
#[derive(Clone)]
struct Shard {
    pool: Pool,
    statements: Statements,
    /// Whether its extension has the check for reads (cleared when it turns out not to).
    read_check: Arc<AtomicBool>,
    /// How an abandoned transaction's statement is cancelled.
    tls: Option<Connector>,
    connect_timeout: Duration,
}

impl Shard {
    fn new(name: &str, config: ShardConfig) -> Result<Shard> {
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            query: config.connect_timeout,
        };
        let tls = connector_of!(config)?;
        let pool = pool::build(config.config, config.pool_size, timeouts, &tls)
            .map_err(|e| Error::Config(format!("shard {name}: {e}")))?;
        Ok(Shard {
            pool,
            statements: config.statements,
            read_check: Arc::new(AtomicBool::new(true)),
            tls: Some(tls),
            connect_timeout: config.connect_timeout,
        })
    }
}

/// What a routed transaction is.
#[derive(Clone, Copy)]
enum Mode {
    /// `run`: on the owning shard, checked before the closure runs; waits out `read_only`.
    Write(TxOptions),
    /// `read`: read-only, on both shards while the entity is `migrating`; `checked` unless the
    /// caller opted out.
    Read { checked: bool },
}

/// How one attempt ended, when it did not succeed.
enum Attempt<E> {
    /// The entity is `read_only`: nothing was sent; wait for the freeze to end.
    ReadOnly,
    /// Nothing went wrong that a retry would repeat: re-run at once (the stamp was adapted to
    /// the shard).
    Again,
    /// The shard refused the route (40001): worth re-running.
    Refused(Rejection, Refusal<E>),
    Fatal(Error),
    /// The closure's own error, not a refusal: returned as it is.
    Caller(E),
}

/// The error that carried a refusal: one of the router's statements, or the closure's.
enum Refusal<E> {
    Ours(tokio_postgres::Error),
    Caller(E),
}

impl<E: 'static> Attempt<E> {
    /// An error of this crate's own statement at `step` on `shard`: a refusal, a lost
    /// connection (named), or any other database error.
    fn db(shard: &str, step: &'static str, e: tokio_postgres::Error) -> Self {
        match Rejection::of(&e) {
            Some(r) => Attempt::Refused(r, Refusal::Ours(e)),
            None if crate::error::connection_lost(&e) => Attempt::Fatal(Error::ShardConnection {
                shard: shard.to_owned(),
                step,
                source: e,
            }),
            None => Attempt::Fatal(Error::Db(e)),
        }
    }

    /// A refusal is recognised in the closure's error when it is this crate's `Error::Db` (`E`
    /// converts from this crate's `Error`, so it is never a bare `tokio_postgres::Error`); any
    /// other error is returned untouched.
    fn caller(e: E) -> Self {
        let any = &e as &dyn Any;
        let db = match any.downcast_ref::<Error>() {
            Some(Error::Db(db)) => Some(db),
            _ => None,
        };
        match db.and_then(Rejection::of) {
            Some(r) => Attempt::Refused(r, Refusal::Caller(e)),
            None => Attempt::Caller(e),
        }
    }
}
