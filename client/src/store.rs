//! The authoritative store: the directory database, read one round trip per query.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::entry::{EntityKey, Entry, State};
use crate::error::{Error, Result};
use crate::metrics::Counters;
use crate::name::Name;
use crate::pool::{self, Connector, Timeouts};
use crate::statements::Statements;
use tokio_postgres::types::Type;

/// The entry and the global version, from one snapshot, in one round trip.
/// The version row is read by its key (`WHERE id`): the table bloats under sustained writes.
const FETCH: &str = "SELECT v.version, d.shard_name, d.target_shard, d.state, d.region, d.version \
                     FROM shard_directory.shard_directory_version v \
                     LEFT JOIN shard_directory.shard_directory d \
                       ON d.entity_type = $1 AND d.entity_id = $2 \
                     WHERE v.id";

pub(crate) const CURRENT_VERSION: &str =
    "SELECT version, extract(epoch FROM now() - updated_at)::float8 FROM shard_directory.shard_directory_version WHERE id";

/// The version, its age, and what changed since `$1`, from one snapshot, in one round trip.
pub(crate) const CHANGES: &str =
    "SELECT version, age, complete, entity_types, entity_ids, versions \
     FROM shard_directory.changes_since($1)";

/// What a read of the directory's version brought.
#[derive(Debug)]
pub(crate) struct Changes {
    /// The version the read asked about.
    pub since: i64,
    pub version: i64,
    /// How long ago the version changed.
    pub age: Option<Duration>,
    /// Every key changed after `since`, with the latest version that changed it; `None` when
    /// the directory cannot say (history purged, too many changes, no `changes_since()`).
    pub changed: Option<Vec<(EntityKey, i64)>>,
}

impl Changes {
    /// From a row of [`CHANGES`], or of [`CURRENT_VERSION`] (nothing known of what changed).
    pub fn from_row(since: i64, row: &Row) -> Changes {
        let changed = (row.len() > 2 && row.get::<_, bool>(2)).then(|| {
            let types: Vec<String> = row.get::<_, Option<_>>(3).unwrap_or_default();
            let ids: Vec<String> = row.get::<_, Option<_>>(4).unwrap_or_default();
            let versions: Vec<i64> = row.get::<_, Option<_>>(5).unwrap_or_default();
            types
                .into_iter()
                .zip(ids)
                .map(|(t, i)| EntityKey::new(t, i))
                .zip(versions)
                .collect()
        });
        Changes {
            since,
            version: row.get(0),
            age: Duration::try_from_secs_f64(row.get::<_, f64>(1)).ok(),
            changed,
        }
    }

    /// Whether `e` says `changes_since()` cannot be used here (an extension older than 0.2.0,
    /// or a role not granted EXECUTE on it); says so once.
    pub fn unavailable(e: &tokio_postgres::Error) -> bool {
        Changes::unavailable_as(e, "changes_since")
    }

    /// Whether `e` says `function` cannot be used here; says so once per function.
    pub fn unavailable_as(e: &tokio_postgres::Error, function: &'static str) -> bool {
        use tokio_postgres::error::SqlState;
        let unavailable = e.code().is_some_and(|c| {
            *c == SqlState::UNDEFINED_FUNCTION || *c == SqlState::INSUFFICIENT_PRIVILEGE
        });
        if unavailable {
            static WARNED: std::sync::Mutex<Vec<&str>> = std::sync::Mutex::new(Vec::new());
            let mut warned = WARNED.lock().expect("warned lock");
            if !warned.contains(&function) {
                warned.push(function);
                let without = match function {
                    "changes_since" => "every directory change flushes the whole cache",
                    _ => "a freeze no mover ends stays until an operator aborts its move",
                };
                tracing::warn!(error = %e, "shard_directory.{function}() is not available \
                    (GRANT EXECUTE ON FUNCTION shard_directory.{function} TO this role, or \
                    ALTER EXTENSION shard_directory UPDATE): {without}");
            }
        }
        unavailable
    }
}

pub(crate) struct Store {
    pool: Pool,
    counters: Arc<Counters>,
    timeouts: Timeouts,
    statements: Statements,
    /// Cleared once `changes_since()` turned out not to be available.
    by_entity: AtomicBool,
}

/// A connection-level failure means "unreachable", and so does a server that answers only to
/// say it is shutting down, starting up or cannot take connections (57P01-57P03, class 08): the
/// outage policy covers both. Any other error the server sent means it answered.
pub(crate) fn classify(e: tokio_postgres::Error) -> Error {
    if e.as_db_error().is_none() || crate::error::connection_lost(&e) {
        Error::DirectoryUnavailable(e)
    } else {
        Error::Directory(e)
    }
}

fn pool_error(e: deadpool_postgres::PoolError, timeouts: Timeouts) -> Error {
    use deadpool_postgres::{PoolError, TimeoutType};
    match e {
        PoolError::Backend(e) => classify(e),
        PoolError::Timeout(TimeoutType::Create) => Error::DirectoryTimeout {
            what: "a new connection",
            after: timeouts.connect,
        },
        PoolError::Timeout(_) => Error::DirectoryTimeout {
            what: "a pooled connection",
            after: timeouts.query,
        },
        other => Error::Config(format!("directory pool: {other}")),
    }
}

impl Store {
    pub fn new(
        config: tokio_postgres::Config,
        size: usize,
        timeouts: Timeouts,
        statements: Statements,
        tls: &Connector,
        counters: Arc<Counters>,
    ) -> Result<Store> {
        let pool = pool::build(config, size, timeouts, tls)
            .map_err(|e| Error::Config(format!("directory pool: {e}")))?;
        Ok(Store {
            pool,
            counters,
            timeouts,
            statements,
            by_entity: AtomicBool::new(true),
        })
    }

    /// Runs `sql` on a pooled connection, within the query timeout.
    async fn query<const N: usize>(
        &self,
        sql: &str,
        params: [(&(dyn ToSql + Sync), Type); N],
    ) -> Result<Vec<Row>> {
        self.counters.store_query();
        let timeouts = self.timeouts;
        let work = async {
            let client = self.pool.get().await.map_err(|e| pool_error(e, timeouts))?;
            self.statements
                .query(&client, &**client, sql, params)
                .await
                .map_err(classify)
        };
        tokio::time::timeout(timeouts.query, work)
            .await
            .unwrap_or(Err(Error::DirectoryTimeout {
                what: "a query",
                after: timeouts.query,
            }))
    }

    /// `sql`'s one row.
    async fn query_one<const N: usize>(
        &self,
        sql: &str,
        params: [(&(dyn ToSql + Sync), Type); N],
    ) -> Result<Row> {
        let rows = self.query(sql, params).await?;
        // Only when the version row is gone: not a directory database, or a broken one.
        rows.into_iter().next().ok_or_else(|| {
            Error::Config(format!(
                "the directory database has no shard_directory_version row (query: {sql})"
            ))
        })
    }

    /// The entity's entry (None if it has none) and the global version it was read at.
    pub async fn fetch(&self, key: &EntityKey) -> Result<(Option<Entry>, i64)> {
        let row = self
            .query_one(
                FETCH,
                [(&key.entity_type, Type::TEXT), (&key.entity_id, Type::TEXT)],
            )
            .await?;
        let directory_version: i64 = row.get(0);
        let entry = row.get::<_, Option<&str>>(1).map(|shard_name| Entry {
            shard_name: Name::new(shard_name),
            target_shard: row.get::<_, Option<&str>>(2).map(Name::new),
            // A state this client does not know is treated as the most restrictive one.
            state: row.get::<_, &str>(3).parse().unwrap_or(State::ReadOnly),
            region: row.get::<_, Option<&str>>(4).map(Name::new),
            version: row.get(5),
            directory_version,
        });
        Ok((entry, directory_version))
    }

    /// The registry's `conninfo` of `shard`, if the shard is registered with one.
    pub async fn conninfo(&self, shard: &str) -> Result<Option<String>> {
        let rows = self
            .query(
                "SELECT conninfo FROM shard_directory.shards WHERE shard_name = $1",
                [(&shard, Type::TEXT)],
            )
            .await?;
        Ok(rows.first().and_then(|r| r.get(0)))
    }

    /// Releases `key` from a freeze whose lease ended with no cutover (`release_expired_freeze`):
    /// the new version, or `None` when there was nothing to release. A directory that cannot
    /// (older than 0.2.0, or this role not granted it) answers `None` too, said once.
    pub async fn release_expired_freeze(&self, key: &EntityKey) -> Result<Option<i64>> {
        let released = self
            .query_one(
                "SELECT shard_directory.release_expired_freeze($1, $2)",
                [(&key.entity_type, Type::TEXT), (&key.entity_id, Type::TEXT)],
            )
            .await;
        match released {
            Ok(row) => Ok(row.get(0)),
            Err(Error::Directory(e)) if Changes::unavailable_as(&e, "release_expired_freeze") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The global version, and how long ago it changed.
    pub async fn current_version(&self) -> Result<(i64, f64)> {
        let row = self.query_one(CURRENT_VERSION, []).await?;
        Ok((row.get(0), row.get(1)))
    }

    /// The global version and what changed since `since`.
    pub async fn changes_since(&self, since: i64) -> Result<Changes> {
        if self.by_entity.load(Ordering::Relaxed) {
            match self.query_one(CHANGES, [(&since, Type::INT8)]).await {
                Err(Error::Directory(e)) if Changes::unavailable(&e) => {
                    self.by_entity.store(false, Ordering::Relaxed)
                }
                row => return Ok(Changes::from_row(since, &row?)),
            }
        }
        let row = self.query_one(CURRENT_VERSION, []).await?;
        Ok(Changes::from_row(since, &row))
    }
}
