//! The cost of the shard-side check. First per call, in one backend (a loop of N calls, minus the
//! same loop without the check); then per transaction under pgbench: no check, the guide's
//! PL/pgSQL function and the native `assert_directory_version()` (without and with an entity) on
//! the same cluster, in interleaved rounds, median TPS of each; last, a one-row INSERT into a
//! table `protect` guards against the same INSERT into one it does not.
//!
//! Run with `bash scripts/bench.sh` (installs a release build first).

use shard_directory_bench::pgbench;
use shard_directory_e2e::Cluster;

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

/// A stamped one-row INSERT transaction into a table `protect` guards, against the same
/// transaction into one it does not, measured in one backend: a procedure runs `TXNS` of them, each
/// committed (set the three settings, INSERT, COMMIT), alternating the tables, best of 5 each. The
/// pgbench comparison below makes the same claim end to end, but its rounds spread by more than
/// the 2% it would have to resolve on this machine.
async fn per_insert(c: &tokio_postgres::Client) {
    const TXNS: i32 = 10_000;
    c.batch_execute(
        "CREATE PROCEDURE bench_inserts(n int, protected bool) LANGUAGE plpgsql AS $$
         BEGIN
           FOR i IN 1..n LOOP
             PERFORM set_config('app.directory_version', '42', true),
                     set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', '7', true);
             IF protected THEN
               INSERT INTO orders_protected (tenant_id, item) VALUES ('7', 'item');
             ELSE
               INSERT INTO orders_plain (tenant_id, item) VALUES ('7', 'item');
             END IF;
             COMMIT;
           END LOOP;
         END $$",
    )
    .await
    .unwrap();
    let timed = async |protected: bool| {
        let start = std::time::Instant::now();
        c.execute("CALL bench_inserts($1, $2)", &[&TXNS, &protected])
            .await
            .unwrap();
        start.elapsed().as_secs_f64() / TXNS as f64 * 1e6
    };
    let (mut plain, mut protected) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        plain = plain.min(timed(false).await);
        protected = protected.min(timed(true).await);
    }
    println!(
        "per stamped one-row INSERT transaction, best of 5 loops of {TXNS} in one backend: \
         plain {plain:.2} us, protected {protected:.2} us: {:.3}x the plain table's rate",
        plain / protected
    );
}

#[tokio::main]
async fn main() {
    let (seconds, rounds) = pgbench::settings();
    let clients = shard_directory_bench::setting("BENCH_CLIENTS", 4u32).to_string();

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
    c.batch_execute(
        "CREATE TABLE orders_plain (tenant_id text NOT NULL, item text NOT NULL,
             order_id bigint GENERATED BY DEFAULT AS IDENTITY, PRIMARY KEY (tenant_id, order_id));
         CREATE TABLE orders_protected (LIKE orders_plain INCLUDING ALL);
         SELECT shard_directory.protect('orders_protected', 'tenant_id', 'tenant');",
    )
    .await
    .unwrap();

    per_call(&c).await;
    per_insert(&c).await;

    println!(
        "\npgbench -M prepared -c {clients} -T {seconds}, {rounds} interleaved rounds, median TPS"
    );
    // BENCH_WORKLOADS=insert runs only that comparison (more rounds for a closer figure).
    let only = std::env::var("BENCH_WORKLOADS").unwrap_or_default();
    for (workload, variants) in [
        ("select", &VARIANTS[..]),
        ("update", &VARIANTS[..]),
        ("insert", &["plain", "protected"][..]),
    ] {
        if !only.is_empty() && !only.split(',').any(|w| w.trim() == workload) {
            continue;
        }
        let variants: Vec<_> = variants
            .iter()
            .map(|v| (*v, pgbench::script(&format!("{workload}_{v}.sql"))))
            .collect();
        pgbench::compare(
            &cluster, "bench", workload, &variants, &clients, &seconds, rounds,
        );
    }
}
