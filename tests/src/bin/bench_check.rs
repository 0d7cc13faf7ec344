//! The cost of the shard-side check. First per call, in one backend (a loop of N calls, minus the
//! same loop without the check); then per transaction under pgbench: no check, the guide's
//! PL/pgSQL function and the native `assert_directory_version()` (without and with an entity) on
//! the same cluster, in interleaved rounds, median TPS of each.
//!
//! Run with `bash scripts/bench.sh` (installs a release build first).

use shard_directory_e2e::{pgbench, Cluster};

const VARIANTS: [&str; 4] = ["none", "plpgsql", "native", "native_entity"];

/// Microseconds per call of each check, from loops of `CALLS` calls in one transaction (after
/// the first call, the transaction-level locks are already held, so this is the steady cost).
async fn per_call(c: &tokio_postgres::Client) {
    const CALLS: i64 = 200_000;
    let timed = async |call: &str, entity: bool| {
        let sql = format!("SELECT count({call}) FROM generate_series(1, $1::int8) g");
        let settings = if entity {
            "set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', '7', true)"
        } else {
            "1"
        };
        let mut best = f64::MAX;
        for _ in 0..5 {
            c.batch_execute(&format!(
                "BEGIN; SELECT set_config('app.directory_version', '42', true), {settings}"
            ))
            .await
            .unwrap();
            let start = std::time::Instant::now();
            c.query_one(&sql, &[&CALLS]).await.unwrap();
            best = best.min(start.elapsed().as_secs_f64());
            c.batch_execute("COMMIT").await.unwrap();
        }
        best
    };
    let base = timed("g", true).await;
    println!("per call, best of 5 loops of {CALLS} calls in one backend:");
    for (name, call, entity) in [
        (
            "plpgsql (guide)",
            "public.guide_assert_directory_version()",
            true,
        ),
        (
            "native",
            "shard_directory.assert_directory_version()",
            false,
        ),
        (
            "native + entity",
            "shard_directory.assert_directory_version()",
            true,
        ),
    ] {
        let t = timed(call, entity).await;
        println!("  {name:<16} {:>7.3} us", (t - base) / CALLS as f64 * 1e6);
    }
}

#[tokio::main]
async fn main() {
    let (seconds, rounds) = pgbench::settings();
    let clients = shard_directory_e2e::setting("BENCH_CLIENTS", 4u32).to_string();

    let cluster = Cluster::start("bench", &[("shared_preload_libraries", "shard_directory")]);
    cluster.create_database_with_extension("bench").await;
    let c = cluster.connect("bench").await;
    c.batch_execute(&std::fs::read_to_string(pgbench::script("guide_plpgsql.sql")).unwrap())
        .await
        .unwrap();
    c.batch_execute("SELECT shard_directory.raise_min_accepted(40)")
        .await
        .unwrap();
    pgbench::run(&cluster, "bench", &["-i", "-q", "-s", "1"]);

    per_call(&c).await;

    println!(
        "\npgbench -M prepared -c {clients} -T {seconds}, {rounds} interleaved rounds, median TPS"
    );
    for workload in ["select", "update"] {
        let variants: Vec<_> = VARIANTS
            .iter()
            .map(|v| (*v, pgbench::script(&format!("{workload}_{v}.sql"))))
            .collect();
        pgbench::compare(
            &cluster, "bench", workload, &variants, &clients, &seconds, rounds,
        );
    }
}
