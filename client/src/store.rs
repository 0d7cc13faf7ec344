//! The authoritative store: the directory database, read with prepared statements.

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use crate::entry::{EntityKey, Entry, State};
use crate::error::{Error, Result};
use crate::metrics::Counters;

/// The entry and the global version, from one snapshot, in one round trip.
const FETCH: &str = "SELECT v.version, d.shard_name, d.target_shard, d.state, d.region, d.version \
                     FROM shard_directory.shard_directory_version v \
                     LEFT JOIN shard_directory.shard_directory d \
                       ON d.entity_type = $1 AND d.entity_id = $2";

pub(crate) const CURRENT_VERSION: &str =
    "SELECT version, extract(epoch FROM now() - updated_at)::float8 FROM shard_directory.shard_directory_version";

pub(crate) struct Store {
    pool: Pool,
    counters: Arc<Counters>,
}

/// A connection-level failure means "unreachable"; an error the server sent means it answered.
pub(crate) fn classify(e: tokio_postgres::Error) -> Error {
    if e.as_db_error().is_some() {
        Error::Directory(e)
    } else {
        Error::DirectoryUnavailable(e)
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => classify(e),
        other => Error::Config(format!("directory pool: {other}")),
    }
}

impl Store {
    pub fn new(
        config: tokio_postgres::Config,
        size: usize,
        counters: Arc<Counters>,
    ) -> Result<Store> {
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size)
            .build()
            .map_err(|e| Error::Config(format!("directory pool: {e}")))?;
        Ok(Store { pool, counters })
    }

    /// The entity's entry (None if it has none) and the global version it was read at.
    pub async fn fetch(&self, key: &EntityKey) -> Result<(Option<Entry>, i64)> {
        self.counters.store_query();
        let client = self.pool.get().await.map_err(pool_error)?;
        let statement = client.prepare_cached(FETCH).await.map_err(classify)?;
        let row = client
            .query_one(&statement, &[&key.entity_type, &key.entity_id])
            .await
            .map_err(classify)?;
        let directory_version: i64 = row.get(0);
        let entry = row.get::<_, Option<String>>(1).map(|shard_name| Entry {
            key: key.clone(),
            shard_name,
            target_shard: row.get(2),
            // A state this client does not know is treated as the most restrictive one.
            state: row.get::<_, &str>(3).parse().unwrap_or(State::ReadOnly),
            region: row.get(4),
            version: row.get(5),
            directory_version,
        });
        Ok((entry, directory_version))
    }

    /// The global version, and how long ago it changed.
    pub async fn current_version(&self) -> Result<(i64, f64)> {
        self.counters.store_query();
        let client = self.pool.get().await.map_err(pool_error)?;
        let statement = client
            .prepare_cached(CURRENT_VERSION)
            .await
            .map_err(classify)?;
        let row = client.query_one(&statement, &[]).await.map_err(classify)?;
        Ok((row.get(0), row.get(1)))
    }
}
