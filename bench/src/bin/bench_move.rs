//! Moving a 100k-row tenant (50k orders, 50k order lines) back and forth between two shards,
//! `logical` and `copy` interleaved, while a writer keeps adding orders for it: the freeze time
//! (writes refused) and the total time of each method, p50 over `BENCH_MOVES` moves each (5 by
//! default), side by side. The copy method's rows/s is compared with a plain binary
//! `COPY ... TO STDOUT` -> `COPY ... FROM STDIN` of the same rows between the same clusters,
//! measured in the same run. Then, as many times, a `--reversible` logical move and its
//! `revert`: the revert's freeze and total time beside a plain logical move's (it copies nothing:
//! the way back kept the source's rows current).
//!
//! Run with `bash scripts/bench.sh move` (installs a release build first).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use shard_directory_client::{DirectoryConfig, EntityKey};
use shard_directory_e2e::Topology;
use shard_directory_mover::{MethodChoice, MoveOptions, MoveRecord, Observer, Phase};
use tokio::sync::watch;

const ORDERS: i64 = 50_000;

/// When the move froze, and when its copy (method copy) finished its last table.
#[derive(Default)]
struct Timings {
    frozen: Option<Instant>,
    copied: Option<Instant>,
}

struct Clock(Arc<Mutex<Timings>>);

impl Observer for Clock {
    fn phase(&self, _move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        if phase == Phase::Frozen {
            self.0.lock().unwrap().frozen = Some(Instant::now());
        }
        Box::pin(std::future::ready(()))
    }

    /// Under the freeze, only the copy method reports rows: once per table, when it is copied.
    fn rows(&self, _move_id: i64, table: &str, _done: i64, _total: i64) {
        let mut t = self.0.lock().unwrap();
        if table == "public.order_lines" && t.frozen.is_some() && t.copied.is_none() {
            t.copied = Some(Instant::now());
        }
    }
}

/// How a measured move was made.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Logical,
    Copy,
    /// A logical move made with `--reversible`.
    Reversible,
    /// The revert of a reversible move.
    Revert,
}

/// One move: how it was made, freeze time, total time, and (copy) its copy step with the rows
/// copied.
struct Measured {
    kind: Kind,
    freeze: Duration,
    total: Duration,
    copy: Option<(Duration, i64)>,
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// A plain binary copy of the tenant's rows from `from` to scratch tables on `to`: its time and
/// the rows copied.
async fn plain_copy(t: &Topology, from: &str, to: &str) -> (Duration, u64) {
    let (source, target) = (t.shard(from).await, t.shard(to).await);
    target
        .batch_execute(
            "DROP TABLE IF EXISTS plain_orders, plain_lines;
             CREATE TABLE plain_orders (LIKE orders); CREATE TABLE plain_lines (LIKE order_lines)",
        )
        .await
        .unwrap();
    let start = Instant::now();
    let mut rows = 0;
    for (table, scratch) in [("orders", "plain_orders"), ("order_lines", "plain_lines")] {
        let out = source
            .copy_out(&format!(
                "COPY (SELECT * FROM {table} WHERE tenant_id = 'big') TO STDOUT (FORMAT binary)"
            ))
            .await
            .unwrap();
        let sink = target
            .copy_in(&format!("COPY {scratch} FROM STDIN (FORMAT binary)"))
            .await
            .unwrap();
        futures_util::pin_mut!(out, sink);
        while let Some(chunk) = out.next().await {
            sink.send(chunk.unwrap()).await.unwrap();
        }
        rows += sink.as_mut().finish().await.unwrap();
    }
    (start.elapsed(), rows)
}

fn other(shard: &str) -> &'static str {
    if shard == "shard_1" {
        "shard_2"
    } else {
        "shard_1"
    }
}

/// Moves tenant 'big' from `at` to `to` (or reverts move `reverts`), timing it.
async fn measure(
    t: &Topology,
    options: MoveOptions,
    kind: Kind,
    at: &str,
    to: &str,
    reverts: Option<i64>,
) -> (MoveRecord, Measured) {
    let timings = Arc::new(Mutex::new(Timings::default()));
    let mover = t
        .mover(options)
        .with_observer(Arc::new(Clock(timings.clone())));
    let start = Instant::now();
    let record = match reverts {
        Some(id) => mover.revert(id).await,
        None => mover.start(&EntityKey::new("tenant", "big"), to).await,
    }
    .unwrap_or_else(|e| panic!("{e}"));
    let total = start.elapsed();
    let freeze = record.freeze_time().expect("recorded");
    let copy = {
        let t = timings.lock().unwrap();
        let rows: i64 = record.tables.values().filter_map(|p| p.verified).sum();
        t.frozen.zip(t.copied).map(|(a, b)| (b - a, rows))
    };
    println!(
        "  move {} {kind:?} {at} -> {to}: freeze {}, total {}",
        record.move_id,
        ms(freeze),
        ms(total)
    );
    let measured = Measured {
        kind,
        freeze,
        total,
        copy,
    };
    (record, measured)
}

#[tokio::main]
async fn main() {
    let moves: usize = shard_directory_bench::setting("BENCH_MOVES", 5);
    println!("starting a directory and two shards ...");
    let t = Topology::start("bench-move").await;
    t.add_tenant("big", "shard_1").await;
    t.add_tenant("other", "shard_1").await;
    t.shard("shard_1")
        .await
        .batch_execute(&format!(
            "BEGIN; SELECT set_config('app.directory_version', '100', true);
             INSERT INTO orders (tenant_id, item) SELECT 'big', 'order ' || g FROM generate_series(1, {ORDERS}) g;
             INSERT INTO order_lines (tenant_id, order_id, line_no, product)
             SELECT tenant_id, order_id, 1, item FROM orders WHERE tenant_id = 'big';
             COMMIT; ANALYZE"
        ))
        .await
        .unwrap();
    println!("tenant 'big': {} rows", 2 * ORDERS);

    // One order a few milliseconds for the tenant while it moves, through a router.
    let (stop, stopped) = watch::channel(false);
    let router = t.router(t.client_directory(DirectoryConfig::default()).await);
    let writer = async {
        let (mut acked, mut refused) = (0u64, 0u64);
        while !*stopped.borrow() {
            let done: Result<(), shard_directory_client::Error> = router
                .run(&EntityKey::new("tenant", "big"), async |tx| {
                    tx.execute(
                        "INSERT INTO orders (tenant_id, item) VALUES ('big', 'live')",
                        &[],
                    )
                    .await?;
                    Ok(())
                })
                .await;
            if done.is_ok() {
                acked += 1
            } else {
                refused += 1
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (acked, refused)
    };

    let bench = async {
        let mut results: Vec<Measured> = Vec::new();
        let mut at = "shard_1";
        for i in 0..2 * moves {
            let (method, kind) = if i % 2 == 0 {
                (MethodChoice::Logical, Kind::Logical)
            } else {
                (MethodChoice::Copy, Kind::Copy)
            };
            let to = other(at);
            let options = MoveOptions {
                method,
                ..Default::default()
            };
            results.push(measure(&t, options, kind, at, to, None).await.1);
            at = to;
        }
        for _ in 0..moves {
            let to = other(at);
            let options = MoveOptions {
                method: MethodChoice::Logical,
                reversible: true,
                ..Default::default()
            };
            let (there, measured) = measure(&t, options, Kind::Reversible, at, to, None).await;
            results.push(measured);
            let back = Some(there.move_id);
            let (_, measured) =
                measure(&t, MoveOptions::default(), Kind::Revert, to, at, back).await;
            results.push(measured);
        }
        let plain = plain_copy(&t, at, other(at)).await;
        stop.send(true).unwrap();
        (results, plain)
    };
    let ((results, plain), (acked, refused)) = tokio::join!(bench, writer);

    let of = |k: Kind| results.iter().filter(move |r| r.kind == k);
    let p50s = |k: Kind| {
        (
            p50(of(k).map(|r| r.freeze).collect()),
            p50(of(k).map(|r| r.total).collect()),
        )
    };
    let (lf, lt) = p50s(Kind::Logical);
    let (cf, ct) = p50s(Kind::Copy);
    let (rf, rt) = p50s(Kind::Reversible);
    let (bf, bt) = p50s(Kind::Revert);
    let copy_rate = |(d, rows): (Duration, i64)| rows as f64 / d.as_secs_f64();
    let mut rates: Vec<f64> = of(Kind::Copy)
        .filter_map(|r| r.copy)
        .map(copy_rate)
        .collect();
    rates.sort_by(f64::total_cmp);
    let copy_p50 = rates[rates.len() / 2];
    let plain_rate = plain.1 as f64 / plain.0.as_secs_f64();
    println!(
        "\n100k-row tenant, p50 of {moves} moves each, a writer adding orders throughout \
         ({acked} acked, {refused} refused while frozen):"
    );
    println!("| method | freeze p50 | total p50 |");
    println!("|---|---|---|");
    println!("| logical | {} | {} |", ms(lf), ms(lt));
    println!("| copy | {} | {} |", ms(cf), ms(ct));
    println!("| logical --reversible | {} | {} |", ms(rf), ms(rt));
    println!("| its revert | {} | {} |", ms(bf), ms(bt));
    println!(
        "freeze logical / copy: {:.2}x; total logical / copy: {:.2}x",
        lf.as_secs_f64() / cf.as_secs_f64(),
        lt.as_secs_f64() / ct.as_secs_f64()
    );
    println!(
        "revert / logical move: freeze {:.2}x, total {:.2}x",
        bf.as_secs_f64() / lf.as_secs_f64(),
        bt.as_secs_f64() / lt.as_secs_f64()
    );
    println!(
        "copy method: {copy_p50:.0} rows/s in its copy step (p50); plain binary COPY of the same \
         tenant between the same shards: {plain_rate:.0} rows/s; ratio {:.2}x",
        copy_p50 / plain_rate
    );
}
