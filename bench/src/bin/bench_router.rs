//! A one-row INSERT transaction through the Rust client's `Router::run` (stamped, checked, its
//! COMMIT told apart from the ROLLBACK PostgreSQL gives an aborted transaction), side by side
//! with the same transaction on a plain tokio-postgres connection, stamped by hand with the same
//! statement: committed with a plain `COMMIT`, and with the router's COMMIT (a `SAVEPOINT` sent
//! ahead of it in its round trip), which is what telling them apart costs; and an INSERT into
//! an unprotected copy of the table with no stamp. One
//! client, transactions per second over `BENCH_SECONDS` per contender and round, `BENCH_ROUNDS`
//! rounds in rotating order, the median round; latency p50 / p99 in µs.
//!
//! Run with `bash scripts/bench.sh router`.

use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use shard_directory_bench::setting;
use shard_directory_client::{Check, DirectoryConfig, EntityKey, Error, Router, Routing};
use shard_directory_e2e::Topology;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

const ORDER: &str = "INSERT INTO orders (tenant_id, item) VALUES ('1', 'x')";
const UNPROTECTED: &str = "INSERT INTO orders_unprotected (tenant_id, item) VALUES ('1', 'x')";
/// What the router sends ahead of its COMMIT (client/src/router/attempt.rs).
const STILL_OPEN: &str = "SAVEPOINT shard_directory_commit";

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Router,
    ByHand,
    ByHandRoutersCommit,
    Unprotected,
}

const CONTENDERS: [(Contender, &str); 4] = [
    (Contender::Router, "`Router::run`, stamped and checked"),
    (
        Contender::ByHand,
        "tokio-postgres, stamped by hand, plain COMMIT",
    ),
    (
        Contender::ByHandRoutersCommit,
        "tokio-postgres, stamped by hand, the router's COMMIT",
    ),
    (
        Contender::Unprotected,
        "tokio-postgres, no stamp, unprotected table",
    ),
];

#[tokio::main]
async fn main() {
    let seconds: f64 = setting("BENCH_SECONDS", 5.0);
    let rounds: usize = setting("BENCH_ROUNDS", 5);
    let t = Topology::start("bench-router").await;
    let version = t.add_tenant("1", "shard_1").await;
    t.on_every_shard("CREATE TABLE orders_unprotected (LIKE orders INCLUDING ALL)")
        .await;
    let directory = t.client_directory(DirectoryConfig::default()).await;
    let router = t.router(directory);
    let mut plain = t.shard("shard_1").await;
    let mut by_hand = t.shard("shard_1").await;
    let stamp = by_hand
        .prepare_typed(Routing::stamp(Check::Write), &[Type::TEXT; 4])
        .await
        .unwrap();

    let mut samples: Vec<Vec<(f64, Vec<f64>)>> = vec![Vec::new(); CONTENDERS.len()];
    for round in 0..rounds {
        for k in 0..CONTENDERS.len() {
            let i = (round + k) % CONTENDERS.len();
            let (contender, _) = CONTENDERS[i];
            let until = Instant::now() + Duration::from_secs_f64(seconds);
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let started = Instant::now();
                match contender {
                    Contender::Router => routed(&router).await,
                    Contender::ByHand => stamped(&mut by_hand, &stamp, version, false).await,
                    Contender::ByHandRoutersCommit => {
                        stamped(&mut by_hand, &stamp, version, true).await
                    }
                    Contender::Unprotected => unstamped(&mut plain).await,
                }
                latencies.push(started.elapsed().as_secs_f64() * 1e6);
            }
            samples[i].push((latencies.len() as f64 / seconds, latencies));
        }
    }

    println!(
        "one-row INSERT transaction, 1 client, median of {rounds} rounds of {seconds} s, \
         latency in µs"
    );
    println!("| contender | transactions/s | p50 / p99 | the router against it |");
    println!("|---|---|---|---|");
    let medians: Vec<(f64, f64, f64)> = samples.into_iter().map(median_round).collect();
    let ours = medians[0].0;
    for ((_, name), (tps, p50, p99)) in CONTENDERS.iter().zip(&medians) {
        println!(
            "| {name} | {tps:.0} | {p50:.0} / {p99:.0} | {:.2}x |",
            ours / tps
        );
    }
}

async fn routed(router: &Router) {
    router
        .run(&EntityKey::new("tenant", "1"), async |tx| {
            tx.execute(ORDER, &[]).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
}

/// BEGIN, the router's stamp statement (prepared once, as the router's is), the INSERT, and a
/// COMMIT: plain, or the router's.
async fn stamped(client: &mut Client, stamp: &Statement, version: i64, routers_commit: bool) {
    let tx = client.transaction().await.unwrap();
    let version = version.to_string();
    tx.query(stamp, &[&version, &"tenant", &"1", &"15000"])
        .await
        .unwrap();
    tx.execute(ORDER, &[]).await.unwrap();
    if routers_commit {
        let probe = tx.client().simple_query_raw(STILL_OPEN).await.unwrap();
        tx.commit().await.unwrap();
        probe.try_collect::<Vec<_>>().await.unwrap();
    } else {
        tx.commit().await.unwrap();
    }
}

/// BEGIN, the INSERT into the unprotected table, COMMIT: the same round trips less the stamp.
async fn unstamped(client: &mut Client) {
    let tx = client.transaction().await.unwrap();
    tx.execute(UNPROTECTED, &[]).await.unwrap();
    tx.commit().await.unwrap();
}

/// The round of median throughput: its transactions/s, and its latency p50 and p99.
fn median_round(mut rounds: Vec<(f64, Vec<f64>)>) -> (f64, f64, f64) {
    rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (tps, mut latencies) = rounds.swap_remove(rounds.len() / 2);
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    (tps, at(0.5), at(0.99))
}
