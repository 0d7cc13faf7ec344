//! The guide's middle layer (feature `redis`): a cache shared by all instances, in Redis.
//!
//! Keys carry the directory's epoch and the version the entry was read at, and a lookup asks for
//! the epoch and version the client knows, so the shared cache can never hand back a mapping
//! older than the client's version, nor one of another history (read before a failover or
//! restore that lost it). Any Redis error, timeout or unreadable value falls through to the
//! directory.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncCommands;
use tokio::sync::OnceCell;

use crate::entry::{EntityKey, Entry};
use crate::metrics::Counters;

/// Where the shared cache lives and how long entries stay.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SharedCacheConfig {
    /// `redis://host:port/db`.
    pub url: String,
    /// Key prefix, to share one Redis between directories.
    pub prefix: String,
    /// How long an entry stays (keys of old versions are never read again; this bounds memory).
    pub ttl: Duration,
    /// Bound on each Redis round trip; past it the lookup goes to the directory.
    pub timeout: Duration,
}

impl SharedCacheConfig {
    /// Defaults: prefix `shard_directory`, one hour TTL, 50 ms timeout.
    ///
    /// ```
    /// let c = shard_directory_client::SharedCacheConfig::new("redis://127.0.0.1:6379");
    /// assert_eq!(c.prefix, "shard_directory");
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        SharedCacheConfig {
            url: url.into(),
            prefix: "shard_directory".into(),
            ttl: Duration::from_secs(3600),
            timeout: Duration::from_millis(50),
        }
    }
}

setters!(SharedCacheConfig {
    prefix: String,
    ttl: Duration,
    timeout: Duration,
});

pub(crate) struct SharedCache {
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
    config: SharedCacheConfig,
}

impl SharedCache {
    pub fn new(config: SharedCacheConfig) -> Result<SharedCache, redis::RedisError> {
        Ok(SharedCache {
            client: redis::Client::open(config.url.as_str())?,
            connection: OnceCell::new(),
            config,
        })
    }

    /// Unambiguous even when ids contain ':' (an epoch has none: digits and a dot).
    fn key(&self, key: &EntityKey, epoch: Option<&str>, version: i64) -> String {
        format!(
            "{}:{}:v{version}:{}:{}:{}",
            self.config.prefix,
            epoch.unwrap_or(""),
            key.entity_type.len(),
            key.entity_type,
            key.entity_id
        )
    }

    /// The connection, made on first use; a failed attempt is retried on the next lookup.
    async fn connection(&self) -> Option<ConnectionManager> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.config.timeout))
            .set_response_timeout(Some(self.config.timeout))
            .set_number_of_retries(1);
        let made = self
            .connection
            .get_or_try_init(|| self.client.get_connection_manager_with_config(config))
            .await;
        match made {
            Ok(c) => Some(c.clone()),
            Err(e) => {
                tracing::debug!(error = %e, "shared cache unreachable");
                None
            }
        }
    }

    /// The entry as read at exactly `version` in `epoch`, if some instance stored it.
    pub async fn get(
        &self,
        key: &EntityKey,
        version: i64,
        epoch: Option<&str>,
        counters: &Counters,
    ) -> Option<Entry> {
        let found: Option<String> = match self.connection().await {
            Some(mut c) => match c.get(self.key(key, epoch, version)).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::debug!(error = %e, "shared cache read failed");
                    counters.shared(false);
                    return None;
                }
            },
            None => {
                counters.shared(false);
                return None;
            }
        };
        let entry = found
            .and_then(|json| serde_json::from_str::<Entry>(&json).ok())
            .filter(|e| e.directory_version == version);
        counters.shared(entry.is_some());
        entry
    }

    /// Stores what this instance read from the directory in `epoch`; errors are only logged.
    pub async fn put(&self, key: &EntityKey, entry: &Entry, epoch: Option<&str>) {
        let Some(mut c) = self.connection().await else {
            return;
        };
        let json = serde_json::to_string(entry).expect("entries serialize");
        let key = self.key(key, epoch, entry.directory_version);
        if let Err(e) = c
            .set_ex::<_, _, ()>(key, json, self.config.ttl.as_secs().max(1))
            .await
        {
            tracing::debug!(error = %e, "shared cache write failed");
        }
    }
}
