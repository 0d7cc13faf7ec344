//! A cache hit, side by side with a `Mutex<HashMap>` holding the same entries: random existing
//! keys, 1 and 2 threads, at each size of `BENCH_ENTRIES` (10,000 and 1,000,000). The client is
//! asked by borrowed `&str` keys (`Directory::lookup`); the baseline twice: with the key built
//! per lookup (what a map keyed by owned strings needs) and with keys built beforehand (the
//! map's own cost alone). Latency is per lookup, from samples of 64 lookups each (one clock
//! read per sample), p50 and p99 over the samples. Two floors are measured in the same run, in
//! the same random order: reading the key alone (every contender does), and the key plus one
//! read of a random 88-byte record from an array as large as the client's cache (no hash map
//! can do with less than one such read): at 1,000,000 entries the floor is the machine's memory
//! latency, not the map.
//!
//! Run with `bash scripts/bench.sh lookup`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use futures_util::{FutureExt, StreamExt};
use shard_directory_bench::{bench_directory, sizes};
use shard_directory_client::{Directory, DirectoryConfig, EntityKey, Entry};

const BATCH: usize = 64;
const SAMPLES: usize = 20_000;

/// p50 and p99 of per-lookup nanoseconds, `run(i)` doing lookup `i`, on `threads` threads.
fn measure(threads: usize, lookups: usize, run: &(dyn Fn(usize) + Sync)) -> (f64, f64) {
    let mut samples: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut out = Vec::with_capacity(SAMPLES);
                    let mut i = t * 7919;
                    for _ in 0..SAMPLES {
                        let start = Instant::now();
                        for _ in 0..BATCH {
                            run(i % lookups);
                            i += 1;
                        }
                        out.push(start.elapsed().as_nanos() as f64 / BATCH as f64);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

#[tokio::main]
async fn main() {
    let sizes = sizes("BENCH_ENTRIES", "10000,1000000");
    let (cluster, dba) = bench_directory("bench-lookup", &[]).await;
    println!(
        "cache hit by random existing key, ns per lookup (p50 / p99 over samples of {BATCH}), \
         side by side with a Mutex<HashMap> of the same entries"
    );
    println!(
        "| entries | threads | this client | mutex map, key built per lookup | ratio | mutex map, keys built beforehand | ratio | floor: key read | floor: key + one random record read |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut loaded = 0;
    for entries in sizes {
        dba.execute(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             SELECT 'tenant', i::text, 'shard_1' FROM generate_series($1::bigint, $2::bigint) i",
            &[&(loaded as i64 + 1), &(entries as i64)],
        )
        .await
        .unwrap();
        loaded = loaded.max(entries);
        let d = Directory::connect(
            cluster.config("bench"),
            DirectoryConfig::default().store_pool_size(8),
        )
        .await
        .unwrap();
        let ids: Vec<String> = (1..=entries).map(|i| i.to_string()).collect();
        let found: Vec<Entry> = futures_util::stream::iter(&ids)
            .map(|id| {
                let d = d.clone();
                async move { d.lookup("tenant", id).await.unwrap() }
            })
            .buffered(32)
            .collect()
            .await;
        let keys: Vec<EntityKey> = ids.iter().map(|id| EntityKey::new("tenant", id)).collect();
        let map: Mutex<HashMap<EntityKey, Entry>> =
            Mutex::new(keys.iter().cloned().zip(found).collect());
        // One random order of the keys, the same for every contender.
        let mut rng = fastrand::Rng::with_seed(7);
        let order: Vec<usize> = (0..entries.min(1 << 20))
            .map(|_| rng.usize(0..entries))
            .collect();
        // The size of a cache node (client/src/cache.rs), one per entry.
        let records: Vec<[u64; 11]> = (0..entries as u64).map(|i| [i; 11]).collect();
        for threads in [1, 2] {
            let ours = measure(threads, order.len(), &|i| {
                let id = &ids[order[i]];
                let hit = d.lookup("tenant", id).now_or_never().expect("a hit");
                black_box(hit.unwrap());
            });
            let built = measure(threads, order.len(), &|i| {
                let key = EntityKey::new("tenant", ids[order[i]].as_str());
                black_box(map.lock().unwrap().get(&key).cloned().expect("present"));
            });
            let prepared = measure(threads, order.len(), &|i| {
                let key = &keys[order[i]];
                black_box(map.lock().unwrap().get(key).cloned().expect("present"));
            });
            let key = |i: usize| {
                let id = ids[order[i]].as_bytes();
                id.len() + id[id.len() - 1] as usize
            };
            let key_only = measure(threads, order.len(), &|i| {
                black_box(key(i));
            });
            let record = measure(threads, order.len(), &|i| {
                black_box(records[order[i]][key(i) % 11]);
            });
            println!(
                "| {entries} | {threads} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2}x | {:.0} / {:.0} | {:.2}x | {:.0} / {:.0} | {:.0} / {:.0} |",
                ours.0,
                ours.1,
                built.0,
                built.1,
                built.0 / ours.0,
                prepared.0,
                prepared.1,
                prepared.0 / ours.0,
                key_only.0,
                key_only.1,
                record.0,
                record.1,
            );
        }
        assert_eq!(
            d.stats().cache_misses,
            entries as u64,
            "every timed lookup was a hit"
        );
    }
}
