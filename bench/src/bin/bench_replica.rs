//! The directory primary's CPU per lookup miss, without and with a read replica. A directory
//! with a streaming standby (synchronous_commit on) holds `BENCH_ENTRIES` tenants; in each round
//! a fresh client without a replica and one with the standby as its replica (one after the
//! other) each look up `BENCH_LOOKUPS` tenants no client looked up before, 8 at a time: every
//! lookup is a miss. Reported: CPU time (user and system, every process of each server) per miss
//! on the primary and on the standby, summed over `BENCH_ROUNDS` rounds, and the ratio of the
//! primary's. The clients' connections are opened before the measure.
//!
//! `BENCH_ENTRIES` (100,000), `BENCH_LOOKUPS` (10,000), `BENCH_ROUNDS` (3). Run with
//! `bash scripts/bench.sh replica`.

use std::time::{Duration, Instant};

use shard_directory_bench::{bench_directory, look_up, seed_tenants, setting};
use shard_directory_client::{Directory, DirectoryConfig};
use shard_directory_e2e::Cluster;

/// CPU time on the primary and the standby, misses served by the replica, and wall time.
#[derive(Default, Clone, Copy)]
struct Tally {
    primary: Duration,
    standby: Duration,
    misses: u64,
    replica_reads: u64,
    elapsed: Duration,
}

/// A client (with `replica` when given) looks up tenants `from..from + lookups`.
async fn misses(
    primary: &Cluster,
    standby: &Cluster,
    replica: bool,
    from: u64,
    lookups: u64,
) -> Tally {
    let mut config = DirectoryConfig::default().store_pool_size(8);
    if replica {
        config = config.replica(standby.config("bench"));
    }
    let d = Directory::connect(primary.config("bench"), config)
        .await
        .unwrap();
    // Opens the pools' connections (a fork each) before the measure.
    look_up(&d, from..from + 64, 8).await;
    let before = (primary.cpu_times(), standby.cpu_times(), d.stats());
    let started = Instant::now();
    look_up(&d, from + 64..from + 64 + lookups, 8).await;
    let elapsed = started.elapsed();
    let after = d.stats();
    Tally {
        primary: primary.cpu_times().since(&before.0),
        standby: standby.cpu_times().since(&before.1),
        misses: after.cache_misses - before.2.cache_misses,
        replica_reads: after.replica_reads - before.2.replica_reads,
        elapsed,
    }
}

#[tokio::main]
async fn main() {
    let entries = setting("BENCH_ENTRIES", 100_000u64);
    let lookups = setting("BENCH_LOOKUPS", 10_000u64);
    let rounds = setting("BENCH_ROUNDS", 3u64);
    let (primary, dba) = bench_directory("bench-replica", &[("synchronous_commit", "on")]).await;
    seed_tenants(&dba, entries).await;
    let standby = primary.standby("bench-replica-standby");
    let per_client = lookups + 64;
    assert!(
        2 * rounds * per_client <= entries,
        "BENCH_ENTRIES too small for the lookups"
    );
    let mut tallies = [Tally::default(); 2];
    let mut from = 1;
    for _ in 0..rounds {
        for (n, replica) in [false, true].into_iter().enumerate() {
            let t = misses(&primary, &standby, replica, from, lookups).await;
            from += per_client;
            let sum = &mut tallies[n];
            sum.primary += t.primary;
            sum.standby += t.standby;
            sum.misses += t.misses;
            sum.replica_reads += t.replica_reads;
            sum.elapsed += t.elapsed;
        }
    }
    println!(
        "directory CPU per lookup miss: {entries} tenants, {rounds} rounds of {lookups} misses \
         per client (8 at a time), CPU of every process of each server (10 ms ticks)"
    );
    println!(
        "| client | misses | served by the replica | primary CPU per miss | standby CPU per miss | misses/s |"
    );
    println!("|---|---|---|---|---|---|");
    let per = |d: Duration, t: &Tally| d.as_secs_f64() * 1e6 / t.misses.max(1) as f64;
    for (t, name) in tallies.iter().zip(["primary only", "with a replica"]) {
        println!(
            "| {name} | {} | {} | {:.1} µs | {:.1} µs | {:.0} |",
            t.misses,
            t.replica_reads,
            per(t.primary, t),
            per(t.standby, t),
            t.misses as f64 / t.elapsed.as_secs_f64()
        );
    }
    println!(
        "primary CPU per miss, with a replica / primary only: {:.3}x",
        per(tallies[1].primary, &tallies[1])
            / per(tallies[0].primary, &tallies[0]).max(f64::EPSILON)
    );
}
