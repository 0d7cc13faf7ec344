//! The relay's subscriber (feature `redis`, `DirectoryConfig::relay`): the directory's changes
//! as `shard-directory relay` republishes them through Redis pub/sub, instead of a LISTEN
//! connection and a `changes_since` read per instance. A message is taken only when sealed with
//! the shared key, in the directory's epoch the client knows, and within `max_age` of the
//! client's clock (either way); a message that starts after the version the client knows (one
//! was missed) makes the client read what changed from the directory itself. While messages
//! arrive (the relay's heartbeat included) the watcher holds no connection; after `silence`
//! without one it LISTENs again.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use shard_directory_protocol::relay::{open, Unsealed};

use crate::cache::Cache;
use crate::entry::EntityKey;
use crate::metrics::Counters;
use crate::store::{Changes, Store};
use crate::watcher::Watch;

/// Where the relay publishes, and how far its messages are trusted.
#[derive(Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// `redis://[user:password@]host:port/db`: a user allowed to SUBSCRIBE to `channel` (and
    /// not to PUBLISH there: only the relay should).
    pub url: String,
    /// The relay's `--channel`.
    pub channel: String,
    /// The key the relay seals its messages with (`--key-file`'s content).
    pub key: Vec<u8>,
    /// How long without a message (the relay publishes at least every `--heartbeat`) before the
    /// watcher LISTENs to the directory itself.
    pub silence: Duration,
    /// A message sealed longer ago than this is not taken (a replay).
    pub max_age: Duration,
}

impl std::fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConfig")
            .field("url", &self.url)
            .field("channel", &self.channel)
            .field("silence", &self.silence)
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl RelayConfig {
    /// Defaults: channel `shard_directory`, 3 s of silence, messages up to 30 s old.
    ///
    /// ```
    /// let c = shard_directory_client::RelayConfig::new("redis://127.0.0.1:6379", b"key".to_vec());
    /// assert_eq!(c.channel, "shard_directory");
    /// ```
    pub fn new(url: impl Into<String>, key: Vec<u8>) -> Self {
        RelayConfig {
            url: url.into(),
            channel: "shard_directory".into(),
            key,
            silence: Duration::from_secs(3),
            max_age: Duration::from_secs(30),
        }
    }
}

setters!(RelayConfig {
    channel: String,
    silence: Duration,
    max_age: Duration,
});

pub(crate) struct Subscriber {
    pub config: RelayConfig,
    pub client: redis::Client,
    pub cache: Arc<Cache>,
    pub watch: Arc<Watch>,
    pub counters: Arc<Counters>,
    pub store: Arc<Store>,
    pub connect_timeout: Duration,
    pub max_backoff: Duration,
    /// When a message last made this client ask the directory itself.
    pub asked: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often a message the client cannot take makes it ask the directory.
const ASKED_EVERY: Duration = Duration::from_secs(1);

impl Subscriber {
    pub async fn run(self) {
        let mut failures = 0;
        loop {
            let ended = self.session(&mut failures).await;
            let wait =
                crate::backoff::jittered(Duration::from_millis(50), failures, self.max_backoff);
            tracing::warn!(error = %ended, retry_in = ?wait, "the relay's subscription ended");
            failures = failures.saturating_add(1);
            tokio::time::sleep(wait).await;
        }
    }

    /// One subscription; returns why it ended.
    async fn session(&self, failures: &mut u32) -> String {
        let connect = self.client.get_async_pubsub();
        let mut pubsub = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return format!("no connection within {:?}", self.connect_timeout),
        };
        let subscribe = pubsub.subscribe(&self.config.channel);
        match tokio::time::timeout(self.connect_timeout, subscribe).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return format!("no subscription within {:?}", self.connect_timeout),
        }
        let mut messages = pubsub.on_message();
        // The relay publishes at least every heartbeat: a subscription silent for longer than
        // the watcher waits is taken for a dead connection (a black-holed Redis never closes
        // it) and made again.
        let quiet = self.config.silence.max(Duration::from_secs(1)) * 2;
        loop {
            let message = match tokio::time::timeout(quiet, messages.next()).await {
                Ok(Some(message)) => message,
                Ok(None) => return "the subscription closed".into(),
                Err(_) => return format!("no message within {quiet:?}"),
            };
            *failures = 0;
            match message.get_payload::<String>() {
                Ok(payload) => self.take(&payload).await,
                Err(_) => self.counters.relay_message("malformed"),
            }
        }
    }

    /// Reads what changed since `known` on the directory's primary and applies it (a new epoch
    /// or a lower version flushes the cache there), at most once per [`ASKED_EVERY`]: a relay
    /// that reads a restored or promoted directory sends messages a client must not take, and
    /// without its own LISTEN the client would otherwise never hear the directory say so.
    async fn ask_the_directory(&self, known: i64) {
        {
            let mut asked = self.asked.lock().expect("asked lock");
            if asked.is_some_and(|at| at.elapsed() < ASKED_EVERY) {
                return;
            }
            *asked = Some(std::time::Instant::now());
        }
        match self.store.changes_since(known).await {
            Ok(changes) => {
                self.watch
                    .learned(&self.cache, &self.counters, &changes, true);
            }
            Err(e) => tracing::debug!(error = %e, "asking the directory about a relay message"),
        }
    }

    /// Applies one message, when it may be taken.
    async fn take(&self, payload: &str) {
        let change = match open(payload, &self.config.key) {
            Ok(change) => change,
            Err(Unsealed::Forged) => return self.counters.relay_message("forged"),
            Err(Unsealed::Malformed) => return self.counters.relay_message("malformed"),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if now.abs_diff(change.sealed_at_ms) > self.config.max_age.as_millis() as u64 {
            return self.counters.relay_message("old");
        }
        // Only the directory itself says the history changed, or went back: a message of
        // another epoch, or below the version known, is a question put to it.
        let known = self.cache.version();
        if self.cache.history().as_deref() != Some(change.epoch.as_str()) {
            self.counters.relay_message("elsewhere");
            return self.ask_the_directory(known).await;
        }
        if change.version < known {
            self.counters.relay_message("behind");
            return self.ask_the_directory(known).await;
        }
        let changes = if change.since > known {
            // A message was missed (or this client is behind): the directory says what changed.
            match self.store.changes_since(known).await {
                Ok(changes) => changes,
                Err(e) => {
                    tracing::debug!(error = %e, "reading what the relay's messages skipped");
                    return;
                }
            }
        } else {
            Changes {
                since: change.since,
                version: change.version,
                age: None,
                changed: change.changed.map(|changed| {
                    changed
                        .into_iter()
                        .map(|(t, i, v)| (EntityKey::new(t, i), v))
                        .collect()
                }),
                epoch: Some(change.epoch),
                recovering: false,
                server: None,
            }
        };
        self.watch
            .learned(&self.cache, &self.counters, &changes, false);
        self.counters.relay_message("taken");
        self.watch.relay_heard();
    }
}
