//! What a move costs the other tenants of its source: the latency of another tenant's routed
//! writes on the source (an order every 2 ms) with no move at all, while a tenant of
//! `BENCH_ROWS` rows (1,000,000 by default; half orders, half lines) is moved away by the logical
//! method, and while it is moved with `--max-rate BENCH_MAX_RATE` (20000 rows/s by default),
//! which paces its initial copy (then the mover's own) and the delete of its rows from the
//! source. p50 and p99 over the whole move, over its initial copy (`copying`) and over its delete
//! (`cleaning_up`), side by side in one run. Each window begins on settled shards (vacuumed and
//! checkpointed), so that none pays for the writes of the one before; the writer is warmed up
//! first, and the window without a move is measured first and last.
//!
//! Run with `bash scripts/bench.sh throttle` (installs a release build first).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use shard_directory_client::{DirectoryConfig, EntityKey};
use shard_directory_e2e::Topology;
use shard_directory_mover::{MethodChoice, MoveOptions, Observer, Phase};
use tokio::sync::watch;

/// The phase the move is in, for the writer to tag its latencies with.
struct Tag(Arc<Mutex<Option<Phase>>>);

impl Observer for Tag {
    fn phase(&self, _move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        *self.0.lock().unwrap() = Some(phase);
        Box::pin(std::future::ready(()))
    }
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Writes an order for `other` every 2 ms until told to stop: each latency with the phase the
/// move was in when it began.
async fn write(
    t: &Topology,
    phase: Arc<Mutex<Option<Phase>>>,
    stopped: watch::Receiver<bool>,
) -> Vec<(Option<Phase>, Duration)> {
    let router = t.router(t.client_directory(DirectoryConfig::default()).await);
    let key = EntityKey::new("tenant", "other");
    let mut samples = Vec::new();
    while !*stopped.borrow() {
        let at = *phase.lock().unwrap();
        let started = Instant::now();
        let done: Result<(), shard_directory_client::Error> = router
            .run(&key, async |tx| {
                tx.execute(
                    "INSERT INTO orders (tenant_id, item) VALUES ('other', 'x')",
                    &[],
                )
                .await?;
                Ok(())
            })
            .await;
        done.expect("the other tenant is never refused");
        samples.push((at, started.elapsed()));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    samples
}

/// The other tenant's latencies while `work` runs.
async fn during(
    t: &Topology,
    phase: Arc<Mutex<Option<Phase>>>,
    work: impl std::future::Future<Output = ()>,
) -> Vec<(Option<Phase>, Duration)> {
    let (stop, stopped) = watch::channel(false);
    let work = async {
        work.await;
        stop.send(true).unwrap();
    };
    let ((), samples) = tokio::join!(work, write(t, phase, stopped));
    samples
}

/// Both shards vacuumed and checkpointed: what the last move wrote and deleted is not left to
/// autovacuum and the checkpointer during the next window.
async fn settle(t: &Topology) {
    for shard in ["shard_1", "shard_2"] {
        let c = t.shard(shard).await;
        for sql in ["VACUUM (ANALYZE)", "CHECKPOINT"] {
            c.batch_execute(sql).await.unwrap();
        }
    }
}

/// `| writes | p50 | p99` of the samples taken in `phase` (all of them for `None`).
fn cells(samples: &[(Option<Phase>, Duration)], phase: Option<Phase>) -> String {
    let mut taken: Vec<Duration> = samples
        .iter()
        .filter(|(p, _)| phase.is_none() || *p == phase)
        .map(|(_, d)| *d)
        .collect();
    if taken.is_empty() {
        return "| - | - | - ".to_owned();
    }
    let (p50, p99) = (percentile(&mut taken, 0.5), percentile(&mut taken, 0.99));
    format!("| {} | {} | {} ", taken.len(), ms(p50), ms(p99))
}

#[tokio::main]
async fn main() {
    let rows: usize = shard_directory_bench::setting("BENCH_ROWS", 1_000_000);
    let max_rate: u64 = shard_directory_bench::setting("BENCH_MAX_RATE", 20_000);
    println!("starting a directory and two shards ...");
    let t = Topology::start("bench-throttle").await;
    shard_directory_bench::seed_tenant(&t, "big", rows).await;
    t.add_tenant("other", "shard_1").await;
    println!("tenant 'big': {rows} rows; tenant 'other' written to on the same shard");
    let big = EntityKey::new("tenant", "big");
    let moving = |max_rate: Option<u64>, to: &'static str, phase: Arc<Mutex<Option<Phase>>>| {
        let mover = t
            .mover(MoveOptions {
                method: MethodChoice::Logical,
                max_rate,
                ..Default::default()
            })
            .with_observer(Arc::new(Tag(phase)));
        let big = big.clone();
        async move {
            let started = Instant::now();
            mover
                .start(&big, to)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            println!(
                "  moved to {to} in {:?} (max rate {max_rate:?})",
                started.elapsed()
            );
        }
    };

    let no_phase = Arc::new(Mutex::new(None));
    let mut runs = Vec::new();
    // The same length as an unthrottled move: measured by moving first, unmeasured, and back.
    let started = Instant::now();
    moving(None, "shard_2", no_phase.clone()).await;
    let length = started.elapsed();
    moving(None, "shard_1", no_phase.clone()).await;
    // The writer's connections and the shards' caches warmed, unmeasured.
    during(
        &t,
        no_phase.clone(),
        tokio::time::sleep(Duration::from_secs(5)),
    )
    .await;
    settle(&t).await;
    let idle = during(&t, no_phase.clone(), tokio::time::sleep(length)).await;
    runs.push(("no move", idle));
    for (name, rate) in [("move", None), ("move, --max-rate", Some(max_rate))] {
        let phase = Arc::new(Mutex::new(None));
        settle(&t).await;
        let samples = during(&t, phase.clone(), moving(rate, "shard_2", phase)).await;
        runs.push((name, samples));
        moving(None, "shard_1", no_phase.clone()).await;
    }
    // No move again, last: a window that drifts with the run shows here.
    settle(&t).await;
    let idle = during(&t, no_phase.clone(), tokio::time::sleep(length)).await;
    runs.push(("no move, again", idle));

    println!();
    println!(
        "Tenant 'other''s routed writes on the source while 'big' ({rows} rows) moves away \
         (logical), an order every 2 ms:"
    );
    println!();
    println!(
        "| | writes | p50 | p99 | writes in the copy | p50 | p99 | writes in the delete | p50 | p99 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, samples) in &runs {
        println!(
            "| {name} {}{}{}|",
            cells(samples, None),
            cells(samples, Some(Phase::Copying)),
            cells(samples, Some(Phase::CleaningUp))
        );
    }
}
