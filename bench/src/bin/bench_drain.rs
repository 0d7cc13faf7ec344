//! The drain of a shard holding `BENCH_TENANTS` tenants of mixed sizes (200 by default: most of
//! a few hundred rows, one in ten of 4,000, one in fifty of 40,000) into two others, as
//! `shard-directory drain shard_1 --to shard_2,shard_3 --apply` runs it: a plan by rows, run as a
//! batch with `--parallel 1`, then on a fresh copy of the same fleet with `--parallel 2` (and as
//! many per shard). Total time, moves per second, and the freezes (p50 and max). Method
//! `BENCH_METHOD` (copy by default; logical takes a subscription per move).
//!
//! Run with `bash scripts/bench.sh drain` (installs a release build first).

use std::time::{Duration, Instant};

use shard_directory_bench::{seed_tenant, setting};
use shard_directory_e2e::Topology;
use shard_directory_mover::{drain, BatchOptions, MethodChoice, MoveOptions, Outcome, Weigh};

/// Rows of tenant `i`: mixed sizes, the same for every run.
fn rows(i: usize) -> usize {
    match i {
        i if i % 50 == 0 => 40_000,
        i if i % 10 == 0 => 4_000,
        i => 100 + (i * 37 % 400),
    }
}

struct Run {
    total: Duration,
    moves: usize,
    freezes: Vec<Duration>,
}

async fn run(tenants: usize, parallel: usize, method: MethodChoice) -> Run {
    let t = Topology::with_shards(&format!("bench-drain-{parallel}"), 3).await;
    for i in 0..tenants {
        seed_tenant(&t, &i.to_string(), rows(i)).await;
    }
    let mover = t.mover(MoveOptions {
        method,
        max_freeze: Duration::from_secs(60),
        ..Default::default()
    });
    let started = Instant::now();
    let fleet = mover.fleet(false).await.expect("read the fleet");
    let to = ["shard_2".to_owned(), "shard_3".to_owned()];
    let plan = drain(&fleet, "shard_1", &to, Weigh::Rows).expect("a plan");
    assert!(
        plan.skipped.is_empty(),
        "left by --max-freeze: {:?}",
        plan.skipped
    );
    let options = BatchOptions {
        parallel,
        per_shard: parallel,
    };
    let batch = mover.record_batch(&plan, options).await.expect("a batch");
    let run = mover.resume_batch(batch).await.expect("the batch ran");
    assert!(run.stopped.is_none(), "{:?}", run.stopped);
    let outcomes = run.moves;
    let total = started.elapsed();
    let mut freezes = Vec::new();
    for (m, outcome) in &outcomes {
        match outcome {
            Outcome::Moved(record) => freezes.push(record.freeze_time().unwrap_or_default()),
            other => panic!("{}/{}: {other:?}", m.entity_type, m.entity_id),
        }
    }
    freezes.sort();
    Run {
        total,
        moves: outcomes.len(),
        freezes,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let tenants: usize = setting("BENCH_TENANTS", 200);
    let method = match setting("BENCH_METHOD", "copy".to_owned()).as_str() {
        "logical" => MethodChoice::Logical,
        _ => MethodChoice::Copy,
    };
    let total_rows: usize = (0..tenants).map(rows).sum();
    println!(
        "drain of shard_1 ({tenants} tenants, {total_rows} rows: orders and their lines) into \
         shard_2 and shard_3, method {method:?}, plan by rows:"
    );
    let mut totals = Vec::new();
    for parallel in [1, 2] {
        let r = run(tenants, parallel, method).await;
        println!(
            "  --parallel {parallel}: {} moves in {:.1} s ({:.1} moves/s); freeze p50 {}, max {}",
            r.moves,
            r.total.as_secs_f64(),
            r.moves as f64 / r.total.as_secs_f64(),
            ms(r.freezes[r.freezes.len() / 2]),
            ms(*r.freezes.last().expect("a move"))
        );
        totals.push(r.total);
    }
    println!(
        "  --parallel 2 took {:.2}x the time of --parallel 1",
        totals[1].as_secs_f64() / totals[0].as_secs_f64()
    );
}
