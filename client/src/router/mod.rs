//! `Router`: runs a caller's closure as one transaction on the shard the directory names,
//! stamped with the client's directory version, and re-runs it when the shard says the route
//! was stale.
//!
//! - `config`: a shard's connection settings, the retry policy, a transaction's options;
//! - `retry`: the retry loop (refusals repaired, backoff, the deadline);
//! - `attempt`: one attempt, one transaction on one shard, stamped and bounded;
//! - `stamp`: the statement that stamps and checks it.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{IsolationLevel, Transaction};
use tracing::Instrument;

use crate::directory::Directory;
use crate::entry::{EntityKey, Entry, State};
use crate::error::{Error, Result};
use crate::pool::{self, Connector, Lent, Timeouts};
use crate::rejection::Rejection;
use crate::statements::Statements;

mod attempt;
mod config;
mod retry;
pub(crate) mod stamp;

use attempt::{Attempt, Mode, Progress, Refusal};
pub use config::{RetryPolicy, ShardConfig, TxOptions};

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
    /// An `Ok` after an error the closure caught (the transaction is aborted, and PostgreSQL
    /// answers its COMMIT with ROLLBACK), or after the closure ended the transaction itself, is
    /// [`Error::Aborted`], never reported committed.
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
