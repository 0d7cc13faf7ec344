//! The shared cache's hit rate under onboarding churn. One instance fills the shared cache with
//! every tenant; then new tenants are inserted at a steady rate while fresh instances start one
//! after another (a deploy, a scale-out) and look up random existing tenants. Side by side, each
//! step starts two: one whose change log keeps what changed (the default), and one that keeps
//! nothing, so that it takes only entries read at the version it knows or later, as when the
//! shared cache's keys carried the version. Reported per instance kind, before the churn and
//! during it: the shared cache's hit rate (of the lookups that reached it), and directory
//! queries per lookup (fills and the change log's backfills).
//!
//! `BENCH_ENTRIES` (100,000), `BENCH_SECONDS` (20, the churn), `BENCH_INSERTS` (50 per second),
//! `BENCH_LOOKUPS` (2,000 per instance). Run with `bash scripts/bench.sh shared`.

use std::time::{Duration, Instant};

use shard_directory_bench::{bench_directory, look_up, seed_tenants, setting, Onboarding};
use shard_directory_client::{Directory, DirectoryConfig, SharedCacheConfig};
use shard_directory_e2e::redis::RedisServer;

/// Instances started per kind during the churn.
const STEPS: u64 = 10;

/// Lookups, the shared cache's hits and misses (the lookups that reached it), and directory
/// queries, summed over instances.
#[derive(Default, Clone, Copy)]
struct Tally {
    lookups: u64,
    hits: u64,
    misses: u64,
    queries: u64,
}

impl Tally {
    fn add(&mut self, t: Tally) {
        self.lookups += t.lookups;
        self.hits += t.hits;
        self.misses += t.misses;
        self.queries += t.queries;
    }

    /// Of the lookups that reached the shared cache (a tenant looked up twice is an in-process
    /// hit the second time).
    fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

/// A fresh instance that keeps `kept` changes looks up `lookups` random tenants of `1..=entries`.
async fn fresh(
    cluster: &shard_directory_e2e::Cluster,
    redis: &RedisServer,
    kept: usize,
    entries: u64,
    lookups: u64,
    seed: u64,
) -> Tally {
    let shared = SharedCacheConfig::new(redis.url()).kept_changes(kept);
    let d = Directory::connect(
        cluster.config("bench"),
        DirectoryConfig::default().shared_cache(shared),
    )
    .await
    .unwrap();
    let before = d.stats();
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..lookups {
        d.lookup("tenant", &rng.u64(1..=entries).to_string())
            .await
            .unwrap();
    }
    let after = d.stats();
    Tally {
        lookups,
        hits: after.shared_cache_hits - before.shared_cache_hits,
        misses: after.shared_cache_misses - before.shared_cache_misses,
        queries: after.store_queries - before.store_queries,
    }
}

#[tokio::main]
async fn main() {
    let entries = setting("BENCH_ENTRIES", 100_000u64);
    let seconds = setting("BENCH_SECONDS", 20u64);
    let per_second = setting("BENCH_INSERTS", 50u64);
    let lookups = setting("BENCH_LOOKUPS", 2_000u64);
    let (cluster, dba) = bench_directory("bench-shared", &[]).await;
    seed_tenants(&dba, entries).await;
    let redis = RedisServer::start().await;
    let warm = Directory::connect(
        cluster.config("bench"),
        DirectoryConfig::default()
            .store_pool_size(8)
            .shared_cache(SharedCacheConfig::new(redis.url())),
    )
    .await
    .unwrap();
    look_up(&warm, 1..=entries, 32).await;
    drop(warm);

    const KINDS: [(&str, usize); 2] = [("change log (100,000)", 100_000), ("version only", 0)];
    let mut quiet = [Tally::default(); 2];
    for (n, (_, kept)) in KINDS.iter().enumerate() {
        quiet[n] = fresh(&cluster, &redis, *kept, entries, lookups, 0).await;
    }

    let onboarding = Onboarding::start(&cluster, per_second).await;
    let started = Instant::now();
    let mut churn = [Tally::default(); 2];
    for step in 1..=STEPS {
        let next = started + Duration::from_secs(seconds) * step as u32 / STEPS as u32;
        tokio::time::sleep_until(next.into()).await;
        for (n, (_, kept)) in KINDS.iter().enumerate() {
            churn[n].add(fresh(&cluster, &redis, *kept, entries, lookups, step).await);
        }
    }
    let inserted = onboarding.stop().await;
    let elapsed = started.elapsed().as_secs_f64();

    println!(
        "shared cache under churn: {entries} tenants in the shared cache, {inserted} new tenants \
         in {elapsed:.1} s ({:.0}/s); fresh instances look up {lookups} random existing tenants \
         each: 1 of each kind before the churn, {STEPS} during it",
        inserted as f64 / elapsed
    );
    let per_lookup = |t: Tally| t.queries as f64 / t.lookups.max(1) as f64;
    println!("| instance | phase | lookups | shared hit rate | directory queries per lookup |");
    println!("|---|---|---|---|---|");
    for (n, (name, _)) in KINDS.iter().enumerate() {
        for (phase, t) in [("quiet", quiet[n]), ("churn", churn[n])] {
            println!(
                "| {name} | {phase} | {} | {:.2}% | {:.3} |",
                t.lookups,
                t.hit_rate() * 100.0,
                per_lookup(t)
            );
        }
    }
    println!(
        "change log, churn / quiet hit rate: {:.3}x; under churn, directory queries per lookup, \
         version only / change log: {:.0}x",
        churn[0].hit_rate() / quiet[0].hit_rate().max(f64::EPSILON),
        per_lookup(churn[1]) / per_lookup(churn[0]).max(f64::EPSILON)
    );
}
