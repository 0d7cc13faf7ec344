//! What the client counts. Every event goes both to the `metrics` facade (the application picks
//! the recorder; this crate never installs one) and to in-process counters that `stats()` and the
//! debug endpoint read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// Metric names, as exported through the `metrics` facade.
pub mod names {
    /// Counter, label `reason`: shard rejections (stale, missing, frozen, moved, serialization).
    pub const REJECTIONS: &str = "shard_directory_rejections_total";
    /// Counter: transactions re-run after a rejection.
    pub const RETRIES: &str = "shard_directory_retries_total";
    /// The guide's name for "served a cached entry while the directory was unreachable".
    pub const SERVING_STALE: &str = "directory.serving_stale";
    /// Counter: lookups served from the in-process cache.
    pub const CACHE_HITS: &str = "shard_directory_cache_hits_total";
    /// Counter: lookups that went to the directory.
    pub const CACHE_MISSES: &str = "shard_directory_cache_misses_total";
    /// Counter: queries sent to the directory database (fills and version reads).
    pub const STORE_QUERIES: &str = "shard_directory_store_queries_total";
    /// Counter: cache invalidations (new directory versions learned).
    pub const INVALIDATIONS: &str = "shard_directory_invalidations_total";
    /// Counter: invalidations that retired every cached entry, because the directory could not
    /// say what changed (its history no longer covers the gap, too many changes, or
    /// `changes_since()` is not available to this role). Otherwise only changed entries go.
    pub const FULL_FLUSHES: &str = "shard_directory_full_flushes_total";
    /// Histogram, seconds: how old a change was when a poll or a reconnect, not a notification, brought it in. Sustained values mean notifications are being missed.
    pub const INVALIDATION_LAG: &str = "shard_directory_invalidation_lag_seconds";
    /// Counter, label `result` (hit, miss): lookups in the shared (Redis) cache; errors count as misses.
    pub const SHARED_CACHE: &str = "shard_directory_shared_cache_total";
    /// Counter, label `result`: reads sent to a directory replica (`served`; `behind`: it had
    /// not replayed the version needed within `replica_wait`; `elsewhere`: another epoch than
    /// the client's; `promoted`: the server is no longer a standby; `ahead`: past the newest
    /// version the primary said; `failed`). All but `served` were then made on the primary.
    pub const REPLICA_READS: &str = "shard_directory_replica_reads_total";
    /// Counter, label `result`: the relay's messages (`taken`; `forged`: not sealed with the
    /// key; `malformed`; `old`: sealed longer ago than `max_age`; `elsewhere`: another epoch
    /// than the client's; `behind`: below the version the client knows). Only `taken` ones
    /// change the cache; an `elsewhere` or `behind` one makes the client ask the directory
    /// itself (at most once a second), which alone says the history changed or went back.
    pub const RELAY_MESSAGES: &str = "shard_directory_relay_messages_total";
    /// Gauge: the directory version this client knows.
    pub const VERSION: &str = "shard_directory_version";
    /// Counter: times the directory's version was found below the one this client knew (a
    /// restore from backup, a failover that lost commits); the client adopted it and flushed.
    pub const VERSION_REGRESSIONS: &str = "shard_directory_version_regressions_total";
    /// Counter: times the directory's epoch changed (it failed over, or was restored): the
    /// client flushed its cache and went on from the version the new history reads.
    pub const EPOCH_CHANGES: &str = "shard_directory_epoch_changes_total";
    /// Gauge: 1 while the watcher's connection is up, 0 while it reconnects (lookups then go
    /// to the store).
    pub const WATCHER_CONNECTED: &str = "shard_directory_watcher_connected";
}

const REASONS: [&str; 6] = [
    "stale",
    "missing",
    "frozen",
    "moved",
    "serialization",
    "other",
];

#[derive(Default)]
pub(crate) struct Counters {
    hits: Hits,
    misses: AtomicU64,
    stale_serves: AtomicU64,
    store_queries: AtomicU64,
    invalidations: AtomicU64,
    full_flushes: AtomicU64,
    retries: AtomicU64,
    shared_hits: AtomicU64,
    shared_misses: AtomicU64,
    replica_served: AtomicU64,
    replica_fallbacks: AtomicU64,
    relay_taken: AtomicU64,
    relay_refused: AtomicU64,
    version_regressions: AtomicU64,
    epoch_changes: AtomicU64,
    rejections: [AtomicU64; REASONS.len()],
}

/// A snapshot of the client's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// See [`names::CACHE_HITS`].
    pub cache_hits: u64,
    /// See [`names::CACHE_MISSES`].
    pub cache_misses: u64,
    /// See [`names::SERVING_STALE`].
    pub serving_stale: u64,
    /// See [`names::STORE_QUERIES`].
    pub store_queries: u64,
    /// See [`names::INVALIDATIONS`].
    pub invalidations: u64,
    /// See [`names::FULL_FLUSHES`].
    pub full_flushes: u64,
    /// See [`names::RETRIES`].
    pub retries: u64,
    /// See [`names::SHARED_CACHE`].
    pub shared_cache_hits: u64,
    /// See [`names::SHARED_CACHE`].
    pub shared_cache_misses: u64,
    /// See [`names::REPLICA_READS`]: served by a replica.
    pub replica_reads: u64,
    /// See [`names::REPLICA_READS`]: sent to a replica, then made on the primary.
    pub replica_fallbacks: u64,
    /// See [`names::RELAY_MESSAGES`]: taken.
    pub relay_messages: u64,
    /// See [`names::RELAY_MESSAGES`]: not taken (forged, malformed, old, elsewhere).
    pub relay_refused: u64,
    /// See [`names::VERSION_REGRESSIONS`].
    pub version_regressions: u64,
    /// See [`names::EPOCH_CHANGES`].
    pub epoch_changes: u64,
    /// Shard rejections by reason: stale, missing, frozen, moved, serialization, other (a
    /// reason this client does not know, returned without a retry). In JSON, an
    /// object (`jq .stats.rejections.moved`).
    #[serde(serialize_with = "by_reason")]
    pub rejections: Vec<(String, u64)>,
}

fn by_reason<S: serde::Serializer>(pairs: &[(String, u64)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(r, n)| (r, n)))
}

impl Stats {
    /// The rejections counted for `reason`.
    pub fn rejections(&self, reason: &str) -> u64 {
        self.rejections
            .iter()
            .find(|(r, _)| r == reason)
            .map_or(0, |(_, n)| *n)
    }
}

/// Cache hits, the one count on the hot path.
struct Hits {
    local: Striped,
    /// Registered once: looking the counter up in the recorder on every hit would cost more
    /// than the hit. (So the recorder must be installed before `Directory::connect`, as
    /// applications do at start-up.)
    exported: metrics::Counter,
}

impl Default for Hits {
    fn default() -> Self {
        Hits {
            local: Striped::default(),
            exported: metrics::counter!(names::CACHE_HITS),
        }
    }
}

/// A counter bumped from many threads at once (every cache hit): one slot per thread, on its own
/// cache line, so that threads do not take the line from each other on every hit.
#[derive(Default)]
struct Striped([Slot; 16]);

#[derive(Default)]
#[repr(align(128))]
struct Slot(AtomicU64);

impl Striped {
    fn bump(&self) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        thread_local! {
            static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) as usize % 16;
        }
        let slot = SLOT.with(|s| *s);
        self.0[slot].0.fetch_add(1, Ordering::Relaxed);
    }

    fn sum(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub fn hit(&self) {
        self.hits.local.bump();
        self.hits.exported.increment(1);
    }

    pub fn miss(&self) {
        bump(&self.misses);
        metrics::counter!(names::CACHE_MISSES).increment(1);
    }

    pub fn served_stale(&self) {
        bump(&self.stale_serves);
        metrics::counter!(names::SERVING_STALE).increment(1);
    }

    pub fn store_query(&self) {
        bump(&self.store_queries);
        metrics::counter!(names::STORE_QUERIES).increment(1);
    }

    /// Counted last: whoever sees the count sees the lag it came with.
    pub fn invalidated(&self, version: i64, lag: Option<Duration>) {
        if let Some(lag) = lag {
            metrics::histogram!(names::INVALIDATION_LAG).record(lag.as_secs_f64());
        }
        metrics::gauge!(names::VERSION).set(version as f64);
        metrics::counter!(names::INVALIDATIONS).increment(1);
        bump(&self.invalidations);
    }

    pub fn flushed(&self) {
        bump(&self.full_flushes);
        metrics::counter!(names::FULL_FLUSHES).increment(1);
    }

    pub fn rejected(&self, reason: &'static str) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            bump(&self.rejections[i]);
        }
        metrics::counter!(names::REJECTIONS, "reason" => reason).increment(1);
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub fn shared(&self, hit: bool) {
        bump(if hit {
            &self.shared_hits
        } else {
            &self.shared_misses
        });
        metrics::counter!(names::SHARED_CACHE, "result" => if hit { "hit" } else { "miss" })
            .increment(1);
    }

    pub fn replica_read(&self, result: &'static str) {
        bump(if result == "served" {
            &self.replica_served
        } else {
            &self.replica_fallbacks
        });
        metrics::counter!(names::REPLICA_READS, "result" => result).increment(1);
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub fn relay_message(&self, result: &'static str) {
        bump(if result == "taken" {
            &self.relay_taken
        } else {
            &self.relay_refused
        });
        metrics::counter!(names::RELAY_MESSAGES, "result" => result).increment(1);
    }

    pub fn version_regressed(&self, version: i64) {
        bump(&self.version_regressions);
        metrics::counter!(names::VERSION_REGRESSIONS).increment(1);
        metrics::gauge!(names::VERSION).set(version as f64);
    }

    pub fn epoch_changed(&self, version: i64) {
        bump(&self.epoch_changes);
        metrics::counter!(names::EPOCH_CHANGES).increment(1);
        metrics::gauge!(names::VERSION).set(version as f64);
    }

    pub fn watcher_connected(&self, up: bool) {
        metrics::gauge!(names::WATCHER_CONNECTED).set(if up { 1.0 } else { 0.0 });
    }

    pub fn retried(&self) {
        bump(&self.retries);
        metrics::counter!(names::RETRIES).increment(1);
    }

    pub fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            cache_hits: self.hits.local.sum(),
            cache_misses: get(&self.misses),
            serving_stale: get(&self.stale_serves),
            store_queries: get(&self.store_queries),
            invalidations: get(&self.invalidations),
            full_flushes: get(&self.full_flushes),
            retries: get(&self.retries),
            shared_cache_hits: get(&self.shared_hits),
            shared_cache_misses: get(&self.shared_misses),
            replica_reads: get(&self.replica_served),
            replica_fallbacks: get(&self.replica_fallbacks),
            relay_messages: get(&self.relay_taken),
            relay_refused: get(&self.relay_refused),
            version_regressions: get(&self.version_regressions),
            epoch_changes: get(&self.epoch_changes),
            rejections: REASONS
                .iter()
                .zip(&self.rejections)
                .map(|(r, c)| (r.to_string(), get(c)))
                .collect(),
        }
    }
}
