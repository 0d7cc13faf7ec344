//! The freeze (writes refused) of a logical move by the tenant's size, while a writer keeps adding
//! orders for it: with the online check (every row compared while the tenant is writable, then
//! under the freeze only the rows changed since) and without it (every row compared under the
//! freeze), interleaved, p50 over `BENCH_MOVES` moves each (2 by default), for tenants of
//! `BENCH_SIZES` rows (half orders, half order lines; 100000,1000000,10000000 by default).
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

/// Moves `id` back and forth `2 * moves` times, the online check on and off in turn, while a
/// writer adds orders for it: the freezes and total times with the check on, then off.
async fn measure(t: &Topology, id: &str, moves: usize) -> [(Vec<Duration>, Vec<Duration>); 2] {
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
        let mut results: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
        let mut at = "shard_1";
        for i in 0..2 * moves {
            let online_check = i % 2 == 0;
            let to = if at == "shard_1" {
                "shard_2"
            } else {
                "shard_1"
            };
            let mover = t.mover(MoveOptions {
                method: MethodChoice::Logical,
                online_check,
                max_freeze: Duration::from_secs(120),
                ..Default::default()
            });
            let start = Instant::now();
            let record = mover
                .start(&key, to)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let (freeze, total) = (record.freeze_time().expect("recorded"), start.elapsed());
            println!(
                "  {id}: move {} {at} -> {to}, online check {}: freeze {}, total {}",
                i + 1,
                if online_check { "on" } else { "off" },
                ms(freeze),
                ms(total)
            );
            let slot = &mut results[usize::from(!online_check)];
            slot.0.push(freeze);
            slot.1.push(total);
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
    let mut rows = Vec::new();
    for &size in &sizes {
        let id = format!("t{size}");
        let started = Instant::now();
        shard_directory_bench::seed_tenant(&t, &id, size).await;
        println!(
            "tenant {id}: {size} rows, seeded in {:?}",
            started.elapsed()
        );
        let [on, off] = measure(&t, &id, moves).await;
        rows.push((size, p50(on.0), p50(on.1), p50(off.0), p50(off.1)));
    }
    println!();
    println!(
        "Logical moves with a writer on the tenant (an order every 5 ms through a router), p50 of \
         {moves} per cell:"
    );
    println!();
    println!("| tenant rows | freeze, online check | total | freeze, every row under it | total | freeze ratio (off / on) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (size, on_freeze, on_total, off_freeze, off_total) in &rows {
        println!(
            "| {size} | {} | {} | {} | {} | {:.1}x |",
            ms(*on_freeze),
            ms(*on_total),
            ms(*off_freeze),
            ms(*off_total),
            off_freeze.as_secs_f64() / on_freeze.as_secs_f64()
        );
    }
    let (first, last) = (rows.first().unwrap(), rows.last().unwrap());
    println!();
    println!(
        "With the online check, the freeze at {} rows is {:.2}x the freeze at {} rows (goal: within \
         2x, and under 300 ms: {})",
        last.0,
        last.1.as_secs_f64() / first.1.as_secs_f64(),
        first.0,
        ms(last.1)
    );
}
