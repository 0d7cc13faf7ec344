//! How a router reaches a shard, how it retries, and how a routed transaction begins.

use super::*;

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
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        crate::backoff::jittered(self.base_backoff, attempt, self.max_backoff)
    }
}

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
