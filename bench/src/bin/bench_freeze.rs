//! The freeze (writes refused) of a move by the tenant's size, while a writer keeps adding
//! orders for it, three ways interleaved: logical with the online check (every row compared
//! while the tenant is writable, then under the freeze only the rows changed since), logical
//! without it (every row compared under the freeze) and copy (the rows copied and compared under
//! the freeze); p50 over `BENCH_MOVES` moves each (2 by default), for tenants of `BENCH_SIZES`
//! rows (half orders, half order lines; 100000,1000000,10000000 by default). Writes a chart of
//! the freezes, `freeze.svg`, beside the results.
//!
//! Run with `bash scripts/bench.sh freeze` (installs a release build first).

use std::time::{Duration, Instant};

use shard_directory_client::{DirectoryConfig, EntityKey};
use shard_directory_e2e::Topology;
use shard_directory_mover::{MethodChoice, MoveOptions};
use tokio::sync::watch;

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// How a measured move is made.
const WAYS: [(&str, MethodChoice, bool); 3] = [
    ("logical, online check", MethodChoice::Logical, true),
    (
        "logical, every row under the freeze",
        MethodChoice::Logical,
        false,
    ),
    ("copy", MethodChoice::Copy, true),
];

/// Freezes and total times of one way's moves.
type Times = (Vec<Duration>, Vec<Duration>);

/// Moves `id` back and forth `3 * moves` times, each of [`WAYS`] in turn, while a writer adds
/// orders for it: the freezes and total times of each way.
async fn measure(t: &Topology, id: &str, moves: usize) -> [Times; 3] {
    let (stop, stopped) = watch::channel(false);
    let router = t.router(t.client_directory(DirectoryConfig::default()).await);
    let key = EntityKey::new("tenant", id);
    let writer = async {
        while !*stopped.borrow() {
            let _: Result<(), shard_directory_client::Error> = router
                .run(&key, async |tx| {
                    tx.execute(
                        "INSERT INTO orders (tenant_id, item) VALUES ($1, 'live')",
                        &[&key.entity_id],
                    )
                    .await?;
                    Ok(())
                })
                .await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let bench = async {
        let mut results: [Times; 3] = Default::default();
        let mut at = "shard_1";
        for i in 0..WAYS.len() * moves {
            let way = i % WAYS.len();
            let (name, method, online_check) = WAYS[way];
            let to = if at == "shard_1" {
                "shard_2"
            } else {
                "shard_1"
            };
            // A copy of 10M rows freezes for minutes: the budget is not what is measured.
            let mover = t.mover(MoveOptions {
                method,
                online_check,
                max_freeze: Duration::from_secs(3600),
                ..Default::default()
            });
            let start = Instant::now();
            let record = mover
                .start(&key, to)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let (freeze, total) = (record.freeze_time().expect("recorded"), start.elapsed());
            println!(
                "  {id}: move {} {at} -> {to}, {name}: freeze {}, total {}",
                i + 1,
                ms(freeze),
                ms(total)
            );
            results[way].0.push(freeze);
            results[way].1.push(total);
            at = to;
        }
        stop.send(true).unwrap();
        results
    };
    let (results, ()) = tokio::join!(bench, writer);
    results
}

#[tokio::main]
async fn main() {
    let moves: usize = shard_directory_bench::setting("BENCH_MOVES", 2);
    let sizes = shard_directory_bench::sizes("BENCH_SIZES", "100000,1000000,10000000");
    println!("starting a directory and two shards ...");
    let t = Topology::start("bench-freeze").await;
    // Per size: each way's freeze and total p50.
    let mut rows: Vec<(usize, [(Duration, Duration); 3])> = Vec::new();
    for &size in &sizes {
        let id = format!("t{size}");
        let started = Instant::now();
        shard_directory_bench::seed_tenant(&t, &id, size).await;
        println!(
            "tenant {id}: {size} rows, seeded in {:?}",
            started.elapsed()
        );
        let measured = measure(&t, &id, moves).await;
        rows.push((size, measured.map(|(f, tt)| (p50(f), p50(tt)))));
    }
    println!();
    println!(
        "Moves with a writer on the tenant (an order every 5 ms through a router), p50 of {moves} \
         per cell:"
    );
    println!();
    println!(
        "| tenant rows | freeze, logical online check | total | freeze, logical every row \
         under it | total | freeze, copy | total | freeze ratio (copy / online check) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (size, [(on_f, on_t), (off_f, off_t), (copy_f, copy_t)]) in &rows {
        println!(
            "| {size} | {} | {} | {} | {} | {} | {} | {:.1}x |",
            ms(*on_f),
            ms(*on_t),
            ms(*off_f),
            ms(*off_t),
            ms(*copy_f),
            ms(*copy_t),
            copy_f.as_secs_f64() / on_f.as_secs_f64()
        );
    }
    let (first, last) = (rows.first().unwrap(), rows.last().unwrap());
    let online = |r: &(usize, [(Duration, Duration); 3])| r.1[0].0;
    println!();
    println!(
        "With the online check, the freeze at {} rows is {:.2}x the freeze at {} rows (goal: within \
         2x, and under 300 ms: {})",
        last.0,
        online(last).as_secs_f64() / online(first).as_secs_f64(),
        first.0,
        ms(online(last))
    );
    let series: Vec<(String, Vec<(f64, f64)>)> = WAYS
        .iter()
        .enumerate()
        .map(|(w, (name, _, _))| {
            let points = rows
                .iter()
                .map(|(size, cells)| (*size as f64, cells[w].0.as_secs_f64() * 1000.0))
                .collect();
            (name.to_string(), points)
        })
        .collect();
    let chart = shard_directory_bench::results_dir().join("freeze.svg");
    shard_directory_bench::chart::lines(
        &chart,
        "A move's freeze by tenant size (p50)",
        ("tenant rows", "freeze, ms"),
        &series,
    );
    println!("chart: {}", chart.display());
}
