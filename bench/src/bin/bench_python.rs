//! The Python package (`python/`) side by side with what a Python application would otherwise
//! use, in one run:
//!
//! - **a cached lookup**: `ShardDirectory.lookup` (the package, and its native call alone)
//!   against the guide's dict-based `ShardDirectory.lookup` holding the same entries, and the
//!   Rust client's `Directory::lookup` (a hit, measured here); and a Python call that does
//!   nothing, the floor every Python contender pays. ns per lookup, p50 / p99 over samples of
//!   64 random existing keys of `BENCH_ENTRIES` (the first size; 10,000) tenants.
//! - **a one-row transaction**: `Router.run` (stamped, checked, on a pooled psycopg connection)
//!   against the same INSERT on a plain psycopg connection, stamped by hand as the guide's
//!   `execute_on_shard` does (the same stamp statement, then the INSERT), and against an INSERT
//!   into an unprotected copy of the table with no stamp at all. One client, transactions per
//!   second over `BENCH_SECONDS` per contender and round, `BENCH_ROUNDS` rounds in rotating
//!   order, the median round; latency p50 / p99 in µs.
//!
//! The Python side is `bench/python/bench_package.py`, run with the virtual environment's
//! Python (`.venv`, scripts/setup.sh) and the package built in release (scripts/bench.sh).
//!
//! Run with `bash scripts/bench.sh python`.

use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use futures_util::FutureExt;
use serde_json::Value;
use shard_directory_bench::{setting, sizes};
use shard_directory_client::DirectoryConfig;
use shard_directory_e2e::topology::{DIRECTORY_DB, SHARD_DB};
use shard_directory_e2e::Topology;

const BATCH: usize = 64;
const SAMPLES: usize = 20_000;

fn main() {
    let entries = sizes("BENCH_ENTRIES", "10000")[0];
    let seconds: f64 = setting("BENCH_SECONDS", 5.0);
    let rounds: usize = setting("BENCH_ROUNDS", 5);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let t = runtime.block_on(Topology::start("bench-python"));
    runtime.block_on(t.add_tenants(entries, "shard_1"));

    let rust = runtime.block_on(rust_lookups(&t, entries, rounds));
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let output = Command::new(format!("{root}/.venv/bin/python"))
        .arg(format!("{root}/bench/python/bench_package.py"))
        .env("BENCH_DIRECTORY", t.directory.conn_str(DIRECTORY_DB))
        .env("BENCH_SHARD", t.shard_cluster("shard_1").conn_str(SHARD_DB))
        .env("BENCH_ENTRIES", entries.to_string())
        .env("BENCH_SECONDS", seconds.to_string())
        .env("BENCH_ROUNDS", rounds.to_string())
        .output()
        .expect("run bench/python/bench_package.py with .venv's python (scripts/setup.sh)");
    assert!(
        output.status.success(),
        "bench_package.py: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let python: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");

    let lookup = &python["lookup"];
    let ns = |name: &str, q: &str| lookup[name][q].as_f64().expect("a figure");
    println!(
        "cached lookup, ns per lookup (p50 / p99 over samples of {BATCH}), {entries} tenants, \
         random existing keys, 1 thread"
    );
    println!("| contender | p50 / p99 | p50 against the package's |");
    println!("|---|---|---|");
    let package = ns("package", "p50");
    let rows = [
        (
            "the package: `ShardDirectory.lookup`",
            ns("package", "p50"),
            ns("package", "p99"),
        ),
        (
            "its native call alone (`_native.Directory.lookup`)",
            ns("native", "p50"),
            ns("native", "p99"),
        ),
        (
            "the guide's dict-based `ShardDirectory.lookup`",
            ns("guide", "p50"),
            ns("guide", "p99"),
        ),
        (
            "a Python call doing nothing (the floor)",
            ns("call", "p50"),
            ns("call", "p99"),
        ),
        ("the Rust client's `Directory::lookup`", rust.0, rust.1),
    ];
    for (name, p50, p99) in rows {
        println!("| {name} | {p50:.0} / {p99:.0} | {:.2}x |", p50 / package);
    }
    println!();

    let tx = &python["transaction"];
    let figure = |name: &str, q: &str| tx[name][q].as_f64().expect("a figure");
    println!(
        "one-row INSERT transaction, 1 client, median of {rounds} rounds of {seconds} s, \
         latency in µs"
    );
    println!("| contender | transactions/s | p50 / p99 | package against it |");
    println!("|---|---|---|---|");
    let ours = figure("package", "tps");
    for (name, key) in [
        ("the package: `Router.run`, stamped and checked", "package"),
        (
            "plain psycopg, stamped by hand (the guide's `execute_on_shard`)",
            "by_hand",
        ),
        (
            "plain psycopg, stamped by hand, BEGIN and the stamp in one round trip",
            "pipelined",
        ),
        ("plain psycopg, no stamp, unprotected table", "unprotected"),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} / {:.0} | {:.2}x |",
            figure(key, "tps"),
            figure(key, "p50"),
            figure(key, "p99"),
            ours / figure(key, "tps"),
        );
    }
}

/// The Rust client's cache hit: p50 and p99 ns per lookup, measured as the Python side does.
async fn rust_lookups(t: &Topology, entries: usize, rounds: usize) -> (f64, f64) {
    let d = t.client_directory(DirectoryConfig::default()).await;
    let ids: Vec<String> = (1..=entries).map(|i| i.to_string()).collect();
    for id in &ids {
        d.lookup("tenant", id).await.unwrap();
    }
    let mut rng = fastrand::Rng::with_seed(7);
    let order: Vec<&str> = (0..entries.min(1 << 20))
        .map(|_| ids[rng.usize(0..entries)].as_str())
        .collect();
    let mut samples = Vec::with_capacity(SAMPLES * rounds);
    let mut i = 0;
    for _ in 0..SAMPLES * rounds {
        let start = Instant::now();
        for _ in 0..BATCH {
            let hit = d.lookup("tenant", order[i % order.len()]).now_or_never();
            black_box(hit.expect("a hit").unwrap());
            i += 1;
        }
        samples.push(start.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}
