//! `shard-directory-relay`, run as `shard-directory relay`: one directory session republishes the directory's changes to the
//! clients through Redis pub/sub, so that a thousand application instances need not each hold a
//! LISTEN connection and read `changes_since` on every change. The session LISTENs and, on each
//! notification and every `heartbeat`, reads the version and what changed since the last read
//! (`changes_since`), in one snapshot, and publishes it sealed
//! ([`shard_directory_protocol::relay`]): a heartbeat tells the clients the relay is there; a
//! client that hears nothing for a while LISTENs itself again. Errors are logged and the
//! session made again, with backoff.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use shard_directory_connect::{describe, ConnectError};
use shard_directory_protocol::relay::{seal, Change};
use shard_directory_protocol::CHANNEL;
use tokio_postgres::Client;

/// Where and how the relay publishes.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// `redis://[user:password@]host:port/db`: a user allowed to PUBLISH on `channel`.
    pub redis: String,
    /// The pub/sub channel.
    pub channel: String,
    /// The key the messages are sealed with (the clients hold it too).
    pub key: Vec<u8>,
    /// How often the relay reads and publishes when nothing is notified.
    pub heartbeat: Duration,
}

/// The application name of the relay's directory session.
pub const RELAY_APPLICATION_NAME: &str = "shard_directory_relay";

const READ: &str = "SELECT version, complete, entity_types, entity_ids, versions, \
     shard_directory.directory_epoch() FROM shard_directory.changes_since($1)";

/// Runs the relay until the process ends; only a Redis URL that does not parse is returned.
pub async fn relay(
    directory: &tokio_postgres::Config,
    options: &RelayOptions,
) -> Result<(), redis::RedisError> {
    let redis = redis::Client::open(options.redis.as_str())?;
    let mut failures: u32 = 0;
    loop {
        let ended = session(directory, &redis, options, &mut failures).await;
        let pause = Duration::from_millis(100 * 2u64.pow(failures.min(4)));
        tracing::warn!(error = %ended, retry_in = ?pause, "the relay's session ended");
        failures = failures.saturating_add(1);
        tokio::time::sleep(pause).await;
    }
}

/// One directory session and one Redis connection; returns why they ended.
async fn session(
    directory: &tokio_postgres::Config,
    redis: &redis::Client,
    options: &RelayOptions,
    failures: &mut u32,
) -> String {
    let (client, mut notifications) =
        match shard_directory_connect::connect_listening(directory, RELAY_APPLICATION_NAME).await {
            Ok(c) => c,
            // As the mover says it: the step, the place, the server's own words.
            Err(ConnectError::Tls(why)) => return format!("configuration: {why}"),
            Err(ConnectError::Db(e)) => return format!("connect: directory: {}", describe(&e)),
        };
    let mut publisher = match redis.get_multiplexed_async_connection().await {
        Ok(p) => p,
        Err(e) => return format!("redis: {e}"),
    };
    if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        return format!("LISTEN: {e}");
    }
    // From the version now: what changed before is the clients' to have read.
    let mut known = match client
        .query_one("SELECT shard_directory.current_version()", &[])
        .await
    {
        Ok(row) => row.get::<_, i64>(0),
        Err(e) => return format!("current_version(): {e}"),
    };
    tracing::info!(version = known, channel = %options.channel, "relay started");
    let mut heartbeat = tokio::time::interval(options.heartbeat);
    loop {
        tokio::select! {
            heard = notifications.recv() => {
                if heard.is_none() {
                    return "the directory closed the session".into();
                }
                // Notifications already queued are covered by the same read.
                while notifications.try_recv().is_ok() {}
            }
            _ = heartbeat.tick() => {}
        }
        let change = match read(&client, known).await {
            Ok(c) => c,
            Err(e) => return format!("changes_since(): {e}"),
        };
        let sealed = seal(&change, &options.key);
        if let Err(e) = publisher
            .publish::<_, _, ()>(&options.channel, sealed)
            .await
        {
            return format!("redis PUBLISH: {e}");
        }
        known = change.version;
        *failures = 0;
    }
}

/// The directory's version and what changed after `since`, read in one snapshot.
async fn read(client: &Client, since: i64) -> Result<Change, tokio_postgres::Error> {
    let row = client.query_one(READ, &[&since]).await?;
    let complete: bool = row.get(1);
    let changed = complete.then(|| {
        let types: Vec<String> = row.get::<_, Option<_>>(2).unwrap_or_default();
        let ids: Vec<String> = row.get::<_, Option<_>>(3).unwrap_or_default();
        let versions: Vec<i64> = row.get::<_, Option<_>>(4).unwrap_or_default();
        types
            .into_iter()
            .zip(ids)
            .zip(versions)
            .map(|((t, i), v)| (t, i, v))
            .collect()
    });
    Ok(Change {
        epoch: row.get(5),
        since,
        version: row.get(0),
        changed,
        sealed_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    })
}
