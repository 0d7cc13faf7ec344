//! Hit rate under churn: three clients in one process hold every existing tenant in cache while
//! new tenants are inserted at a steady rate; one learns what changed (`changes_since`, the
//! default) from its own LISTEN, one the same through the relay (`shard-directory relay`, run in
//! this process, and Redis pub/sub), the last only the version (a role not granted
//! `changes_since`, so every change flushes its whole cache, as before 0.2.0). Each looks up
//! random existing tenants the whole time; the hit rate of each and their ratios are reported,
//! with the memory the by-entity client's cache took per entry (RSS growth over its warm-up /
//! entries).
//!
//! `BENCH_ENTRIES` (1,000,000), `BENCH_SECONDS` (20, the churn), `BENCH_INSERTS` (50 per second).
//! Run with `bash scripts/bench.sh churn`.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_bench::{
    bench_directory, look_up, seed_tenants, setting, start_relay, Onboarding, RELAY_KEY,
};
use shard_directory_client::{Directory, DirectoryConfig, RelayConfig};
use shard_directory_e2e::reaches;

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[tokio::main]
async fn main() {
    let entries = setting("BENCH_ENTRIES", 1_000_000u64);
    let seconds = setting("BENCH_SECONDS", 20u64);
    let per_second = setting("BENCH_INSERTS", 50u64);
    let (cluster, dba) = bench_directory("bench-churn", &[]).await;
    seed_tenants(&dba, entries).await;
    dba.batch_execute(
        "CREATE ROLE version_only_router LOGIN; \
         GRANT USAGE ON SCHEMA shard_directory TO version_only_router; \
         GRANT SELECT ON shard_directory.shard_directory, shard_directory.shard_directory_version, \
           shard_directory.shards TO version_only_router",
    )
    .await
    .unwrap();
    let settings = || DirectoryConfig::default().store_pool_size(8);
    let before = rss();
    let by_entity = Directory::connect(cluster.config("bench"), settings())
        .await
        .unwrap();
    look_up(&by_entity, 1..=entries, 32).await;
    let per_entry = (rss() - before) as f64 / entries as f64;
    let mut config = cluster.config("bench");
    config.user("version_only_router");
    let flushing = Directory::connect(config, settings()).await.unwrap();
    look_up(&flushing, 1..=entries, 32).await;
    let redis = start_relay(&cluster).await;
    let relay = RelayConfig::new(redis.url(), RELAY_KEY.to_vec());
    let relayed = Directory::connect(cluster.config("bench"), settings().relay(relay))
        .await
        .unwrap();
    look_up(&relayed, 1..=entries, 32).await;

    let onboarding = Onboarding::start(&cluster, per_second).await;
    let stop = Arc::new(AtomicBool::new(false));
    let clients = [
        ("by entity", &by_entity),
        ("by entity, through the relay", &relayed),
        ("full flush", &flushing),
    ];
    let start_stats: Vec<_> = clients.iter().map(|(_, d)| d.stats()).collect();
    let started = Instant::now();
    let mut readers = Vec::new();
    for (_, d) in clients {
        for task in 0..2u64 {
            let (d, stop) = (d.clone(), stop.clone());
            readers.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(task);
                while !stop.load(Relaxed) {
                    let id = rng.u64(1..=entries).to_string();
                    d.lookup("tenant", &id).await.unwrap();
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Relaxed);
    let inserted = onboarding.stop().await;
    for r in readers {
        r.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let last = dba
        .query_one("SELECT shard_directory.current_version()", &[])
        .await
        .unwrap()
        .get(0);
    for (_, d) in clients {
        reaches(d, last).await;
    }

    println!(
        "hit rate under churn: {entries} tenants cached, {inserted} new tenants in {elapsed:.1} s \
         ({:.0}/s), random lookups of existing tenants (2 tasks per client)",
        inserted as f64 / elapsed
    );
    println!("| client | lookups | hit rate | full flushes | relay messages taken |");
    println!("|---|---|---|---|---|");
    let mut rates = Vec::new();
    for ((name, d), start) in clients.iter().zip(start_stats) {
        let s = d.stats();
        let (hits, misses) = (
            s.cache_hits - start.cache_hits,
            s.cache_misses - start.cache_misses,
        );
        let rate = hits as f64 / (hits + misses).max(1) as f64;
        rates.push(rate);
        println!(
            "| {name} | {} | {:.4}% | {} | {} |",
            hits + misses,
            rate * 100.0,
            s.full_flushes - start.full_flushes,
            s.relay_messages - start.relay_messages
        );
    }
    println!(
        "by entity / full flush hit rate: {:.1}x; through the relay / own LISTEN: {:.4}x; cache \
         memory per entry (by entity, RSS growth over the warm-up / {entries}): {per_entry:.0} B",
        rates[0] / rates[2].max(f64::EPSILON),
        rates[1] / rates[0].max(f64::EPSILON)
    );
}
