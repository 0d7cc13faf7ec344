//! Hit rate under churn: two clients in one process hold every existing tenant in cache while new
//! tenants are inserted at a steady rate; one learns what changed (`changes_since`, the default),
//! the other only the version (a role not granted `changes_since`, so every change flushes its
//! whole cache, as before 0.2.0). Both look up random existing tenants the whole time; the hit
//! rate of each and their ratio is reported, with the memory the by-entity client's cache took
//! per entry (RSS growth over its warm-up / entries).
//!
//! `BENCH_ENTRIES` (1,000,000), `BENCH_SECONDS` (20, the churn), `BENCH_INSERTS` (50 per second).
//! Run with `bash scripts/bench.sh churn`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use shard_directory_bench::{bench_directory, setting};
use shard_directory_client::{Directory, DirectoryConfig};
use shard_directory_e2e::reaches;

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Looks up every tenant once, 32 at a time.
async fn warm(d: &Directory, entries: u64) {
    futures_util::stream::iter(1..=entries)
        .map(|i| {
            let d = d.clone();
            async move { d.lookup("tenant", &i.to_string()).await.unwrap() }
        })
        .buffer_unordered(32)
        .for_each(|_| async {})
        .await;
}

#[tokio::main]
async fn main() {
    let entries = setting("BENCH_ENTRIES", 1_000_000u64);
    let seconds = setting("BENCH_SECONDS", 20u64);
    let per_second = setting("BENCH_INSERTS", 50u64);
    let (cluster, dba) = bench_directory("bench-churn", &[]).await;
    dba.batch_execute(&format!(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
           SELECT 'tenant', i::text, 'shard_1' FROM generate_series(1, {entries}) i; \
         CREATE ROLE version_only_router LOGIN; \
         GRANT USAGE ON SCHEMA shard_directory TO version_only_router; \
         GRANT SELECT ON shard_directory.shard_directory, shard_directory.shard_directory_version, \
           shard_directory.shards TO version_only_router"
    ))
    .await
    .unwrap();
    dba.batch_execute("VACUUM ANALYZE").await.unwrap();
    let settings = || DirectoryConfig::default().store_pool_size(8);
    let before = rss();
    let by_entity = Directory::connect(cluster.config("bench"), settings())
        .await
        .unwrap();
    warm(&by_entity, entries).await;
    let per_entry = (rss() - before) as f64 / entries as f64;
    let mut config = cluster.config("bench");
    config.user("version_only_router");
    let flushing = Directory::connect(config, settings()).await.unwrap();
    warm(&flushing, entries).await;

    let stop = Arc::new(AtomicBool::new(false));
    let inserted = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, inserted) = (stop.clone(), inserted.clone());
        let w = cluster.connect("bench").await;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second as u32);
            while !stop.load(Relaxed) {
                tick.tick().await;
                let id = format!("new-{}", inserted.fetch_add(1, Relaxed));
                w.execute(
                    "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
                     VALUES ('tenant', $1, 'shard_1')",
                    &[&id],
                )
                .await
                .unwrap();
            }
        })
    };
    let clients = [("by entity", &by_entity), ("full flush", &flushing)];
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
    writer.await.unwrap();
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

    let inserted = inserted.load(Relaxed);
    println!(
        "hit rate under churn: {entries} tenants cached, {inserted} new tenants in {elapsed:.1} s \
         ({:.0}/s), random lookups of existing tenants (2 tasks per client)",
        inserted as f64 / elapsed
    );
    println!("| client | lookups | hit rate | full flushes |");
    println!("|---|---|---|---|");
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
            "| {name} | {} | {:.4}% | {} |",
            hits + misses,
            rate * 100.0,
            s.full_flushes - start.full_flushes
        );
    }
    println!(
        "by entity / full flush hit rate: {:.1}x; cache memory per entry (by entity, RSS growth \
         over the warm-up / {entries}): {per_entry:.0} B",
        rates[0] / rates[1].max(f64::EPSILON)
    );
}
