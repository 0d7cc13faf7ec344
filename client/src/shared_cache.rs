//! The guide's middle layer (feature `redis`): a cache shared by all instances, in Redis.
//!
//! Keys carry the directory's epoch (so an entry of another history, read before a failover or
//! restore that lost it, is never found), and each value the version it was read at. The newest
//! read stays: an instance storing an older one leaves it. The shared cache says only what the
//! directory had at that version; whether that is still the entry at the version the client
//! knows is the client's change log to say ([`crate::cache::Cache::fill_shared`]), so a change
//! elsewhere in the directory does not cost the entries that did not change. Any Redis error,
//! timeout or unreadable value falls through to the directory.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncCommands;
use tokio::sync::OnceCell;

use crate::entry::{EntityKey, Entry};

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
    /// Changes the client remembers, key by key, to tell whether an entry another instance read
    /// at an older version is still current (a 32-byte map entry and a 32-byte queue entry
    /// each, with their tables' slack). An entry read before the
    /// oldest is checked with one `changes_since()` read back to it, at most once a second.
    pub kept_changes: usize,
}

impl SharedCacheConfig {
    /// Defaults: prefix `shard_directory`, one hour TTL, 50 ms timeout, 100,000 changes kept.
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
            kept_changes: 100_000,
        }
    }
}

setters!(SharedCacheConfig {
    prefix: String,
    ttl: Duration,
    timeout: Duration,
    kept_changes: usize,
});

/// Sets the key to `ARGV[1]` (an entry's JSON) for `ARGV[3]` seconds unless it holds a read
/// newer than `ARGV[2]`.
const PUT_NEWEST: &str = r"
local held = redis.call('GET', KEYS[1])
if held then
  local ok, entry = pcall(cjson.decode, held)
  if ok and type(entry) == 'table' and tonumber(entry.directory_version)
     and tonumber(entry.directory_version) > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
";

pub(crate) struct SharedCache {
    client: redis::Client,
    put: redis::Script,
    connection: OnceCell<ConnectionManager>,
    config: SharedCacheConfig,
}

impl SharedCache {
    pub fn new(config: SharedCacheConfig) -> Result<SharedCache, redis::RedisError> {
        Ok(SharedCache {
            client: redis::Client::open(config.url.as_str())?,
            put: redis::Script::new(PUT_NEWEST),
            connection: OnceCell::new(),
            config,
        })
    }

    /// Unambiguous even when ids contain ':' (an epoch has none: digits and a dot).
    fn key(&self, key: &EntityKey, epoch: Option<&str>) -> String {
        format!(
            "{}:{}:{}:{}:{}",
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

    pub fn config(&self) -> &SharedCacheConfig {
        &self.config
    }

    /// The newest entry of `key` some instance stored in `epoch`, with the version it was read
    /// at (`directory_version`); `None` on any error.
    pub async fn get(&self, key: &EntityKey, epoch: Option<&str>) -> Option<Entry> {
        let found: Option<String> = match self.connection().await?.get(self.key(key, epoch)).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "shared cache read failed");
                return None;
            }
        };
        serde_json::from_str(&found?).ok()
    }

    /// Stores what this instance read from the directory in `epoch`, unless a newer read is
    /// there; errors are only logged.
    pub async fn put(&self, key: &EntityKey, entry: &Entry, epoch: Option<&str>) {
        let Some(mut c) = self.connection().await else {
            return;
        };
        let json = serde_json::to_string(entry).expect("entries serialize");
        let stored = self
            .put
            .key(self.key(key, epoch))
            .arg(json)
            .arg(entry.directory_version)
            .arg(self.config.ttl.as_secs().max(1))
            .invoke_async::<i64>(&mut c)
            .await;
        if let Err(e) = stored {
            tracing::debug!(error = %e, "shared cache write failed");
        }
    }
}
