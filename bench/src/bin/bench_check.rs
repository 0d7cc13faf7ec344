//! The cost of the shard-side check. First per call, in one backend (a loop of N calls, minus the
//! same loop without the check); then per transaction under pgbench: no check, the guide's
//! PL/pgSQL function and the native `assert_directory_version()` (without and with an entity) on
//! the same cluster, in interleaved rounds, median TPS of each; last, a one-row INSERT into a
//! table `protect` guards against the same INSERT into one it does not; and the counting behind
//! `entity_stats()`, on against off, per checked transaction.
//!
//! Run with `bash scripts/bench.sh` (installs a release build first).

use shard_directory_bench::pgbench;
use shard_directory_e2e::Cluster;

const VARIANTS: [&str; 4] = ["none", "plpgsql", "native", "native_entity"];

/// Microseconds per call of each check, from loops of `CALLS` calls in one transaction (after
/// the first call, the transaction-level locks are already held, so this is the steady cost).
async fn per_call(c: &tokio_postgres::Client) {
    const CALLS: i64 = 200_000;
    let timed = async |call: &str, entity: bool, counting: bool| {
        let sql = format!("SELECT count({call}) FROM generate_series(1, $1::int8) g");
        let settings = if entity {
            "set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', '7', true)"
        } else {
            "1"
        };
        let counting = if counting { "on" } else { "off" };
        let mut best = f64::MAX;
        for _ in 0..5 {
            c.batch_execute(&format!(
                "BEGIN; SET LOCAL shard_directory.entity_stats = {counting};
                 SELECT set_config('app.directory_version', '42', true), {settings}"
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
    let base = timed("g", true, true).await;
    println!("per call, best of 5 loops of {CALLS} calls in one backend:");
    let native = "shard_directory.assert_directory_version()";
    for (name, call, entity, counting) in [
        (
            "plpgsql (guide)",
            "public.guide_assert_directory_version()",
            true,
            true,
        ),
        ("native", native, false, true),
        ("native + entity", native, true, true),
        ("native + entity, entity_stats off", native, true, false),
    ] {
        let t = timed(call, entity, counting).await;
        println!("  {name:<34} {:>7.3} us", (t - base) / CALLS as f64 * 1e6);
    }
}

/// A stamped one-row INSERT transaction into a table `protect` guards, against the same
/// transaction into one it does not, measured in one backend: a procedure runs `TXNS` of them, each
/// committed (set the three settings, INSERT, COMMIT), alternating the tables, best of 5 each. In
/// between, a table `protect(table)` guards with its statement trigger alone (the version and the
/// declared entity, no row's key), which splits the cost between the two triggers. The pgbench
/// comparison below makes the same claim end to end, but its rounds spread by more than the 2% it
/// would have to resolve on this machine.
async fn per_insert(c: &tokio_postgres::Client) {
    const TXNS: i32 = 10_000;
    c.batch_execute(
        "CREATE PROCEDURE bench_inserts(n int, variant int) LANGUAGE plpgsql AS $$
         BEGIN
           FOR i IN 1..n LOOP
             PERFORM set_config('app.directory_version', '42', true),
                     set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', '7', true);
             IF variant = 2 THEN
               INSERT INTO orders_protected (tenant_id, item) VALUES ('7', 'item');
             ELSIF variant = 1 THEN
               INSERT INTO orders_statement_checked (tenant_id, item) VALUES ('7', 'item');
             ELSE
               INSERT INTO orders_plain (tenant_id, item) VALUES ('7', 'item');
             END IF;
             COMMIT;
           END LOOP;
         END $$",
    )
    .await
    .unwrap();
    let timed = async |variant: i32| {
        let start = std::time::Instant::now();
        c.execute("CALL bench_inserts($1, $2)", &[&TXNS, &variant])
            .await
            .unwrap();
        start.elapsed().as_secs_f64() / TXNS as f64 * 1e6
    };
    let mut best = [f64::MAX; 3];
    for _ in 0..5 {
        for (variant, best) in best.iter_mut().enumerate() {
            *best = best.min(timed(variant as i32).await);
        }
    }
    let [plain, statement, protected] = best;
    println!(
        "per stamped one-row INSERT transaction, best of 5 loops of {TXNS} in one backend: \
         plain {plain:.2} us, protected {protected:.2} us: {:.3}x the plain table's rate; \
         the statement trigger alone (protect(table)) {statement:.2} us: {:.3}x, so {:.2} us of \
         the {:.2} us are the statement trigger's and {:.2} us the row trigger's",
        plain / protected,
        plain / statement,
        statement - plain,
        protected - plain,
        protected - statement
    );
}

/// The counting behind `entity_stats()`, on against off, per checked transaction, in instructions
/// (callgrind), which wall-clock loops on this machine cannot resolve to 2%: a single-user backend
/// on a stopped copy of the cluster runs a procedure of `TXNS` transactions (the three settings,
/// the check, COMMIT), minus the same backend running none; the same entity throughout, then a
/// new one each transaction among 5,000 (five times what the table holds, so most are newcomers).
async fn per_counted_transaction() {
    const TXNS: i32 = 20_000;
    let cluster = Cluster::start(
        "bench-load",
        &[("shared_preload_libraries", "shard_directory")],
    );
    cluster.create_database_with_extension("bench").await;
    cluster
        .connect("bench")
        .await
        .batch_execute(
            "SELECT shard_directory.raise_min_accepted(40);
             CREATE PROCEDURE bench_checks(n int, entities int) LANGUAGE plpgsql AS $$
             BEGIN
               FOR i IN 1..n LOOP
                 PERFORM set_config('app.directory_version', '42', true),
                         set_config('app.entity_type', 'tenant', true),
                         set_config('app.entity_id', (i % entities)::text, true);
                 PERFORM shard_directory.assert_directory_version();
                 COMMIT;
               END LOOP;
             END $$",
        )
        .await
        .unwrap();
    cluster.stop();
    let out = cluster.scratch_path("callgrind.out");
    let out_file = format!("--callgrind-out-file={}", out.display());
    let instructions = |counting: &str, txns: i32, entities: i32| -> f64 {
        let mut backend =
            cluster.single_user("bench", &["valgrind", "--tool=callgrind", &out_file]);
        backend
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = backend
            .spawn()
            .expect("valgrind (bash scripts/setup.sh installs it)");
        let input = format!(
            "SET shard_directory.entity_stats = {counting}\nCALL bench_checks({txns}, {entities})\n"
        );
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
        let done = child.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&done.stderr);
        assert!(!log.contains("ERROR"), "{log}");
        let collected = log
            .lines()
            .find_map(|l| l.split("Collected : ").nth(1))
            .unwrap_or_else(|| panic!("no callgrind total in:\n{log}"));
        collected.trim().parse().unwrap()
    };
    println!("per checked transaction, instructions (callgrind, {TXNS} in a single-user backend), entity_stats:");
    for entities in [1, 5_000] {
        let per_txn = |counting| {
            (instructions(counting, TXNS, entities) - instructions(counting, 0, entities))
                / f64::from(TXNS)
        };
        let (off, on) = (per_txn("off"), per_txn("on"));
        println!(
            "  {entities:>5} entities: off {off:.0}, on {on:.0}: {:+.2}%",
            (on / off - 1.0) * 100.0
        );
    }
    cluster.restart();
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
         SELECT shard_directory.protect('orders_protected', 'tenant_id', 'tenant');
         CREATE TABLE orders_statement_checked (LIKE orders_plain INCLUDING ALL);
         SELECT shard_directory.protect('orders_statement_checked');",
    )
    .await
    .unwrap();

    per_call(&c).await;
    per_insert(&c).await;
    per_counted_transaction().await;

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
