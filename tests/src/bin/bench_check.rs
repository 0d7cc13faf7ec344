//! The cost of the shard-side check. First per call, in one backend (a loop of N calls, minus the
//! same loop without the check); then per transaction under pgbench: no check, the guide's
//! PL/pgSQL function and the native `assert_directory_version()` (without and with an entity) on
//! the same cluster, in interleaved rounds, median TPS of each.
//!
//! Run with `bash scripts/bench.sh` (installs a release build first).

use std::path::Path;

use shard_directory_e2e::Cluster;

const VARIANTS: [&str; 4] = ["none", "plpgsql", "native", "native_entity"];

fn pgbench(cluster: &Cluster, args: &[&str]) -> String {
    let out = cluster
        .client_command("pgbench")
        .args(args)
        .arg("bench")
        .output()
        .expect("run pgbench");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pgbench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn tps(report: &str) -> f64 {
    report
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("tps in pgbench output")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

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
    let seconds = std::env::var("BENCH_SECONDS").unwrap_or_else(|_| "10".into());
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let clients = std::env::var("BENCH_CLIENTS").unwrap_or_else(|_| "4".into());
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/pgbench");

    let cluster = Cluster::start("bench", &[("shared_preload_libraries", "shard_directory")]);
    cluster.create_database_with_extension("bench").await;
    let c = cluster.connect("bench").await;
    c.batch_execute(&std::fs::read_to_string(scripts.join("guide_plpgsql.sql")).unwrap())
        .await
        .unwrap();
    c.batch_execute("SELECT shard_directory.raise_min_accepted(40)")
        .await
        .unwrap();
    pgbench(&cluster, &["-i", "-q", "-s", "1"]);

    per_call(&c).await;

    println!("\npgbench -M prepared -c {clients} -j 2 -T {seconds}, {rounds} interleaved rounds, median TPS");
    for workload in ["select", "update"] {
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
        for _ in 0..rounds {
            for (i, variant) in VARIANTS.iter().enumerate() {
                let script = scripts.join(format!("{workload}_{variant}.sql"));
                let report = pgbench(
                    &cluster,
                    &[
                        "-n",
                        "-M",
                        "prepared",
                        "-c",
                        &clients,
                        "-j",
                        "2",
                        "-T",
                        &seconds,
                        "-f",
                        script.to_str().unwrap(),
                    ],
                );
                results[i].push(tps(&report));
            }
        }
        let base = median(results[0].clone());
        for (variant, r) in VARIANTS.iter().zip(results) {
            let m = median(r.clone());
            println!(
                "{workload:>6} {variant:<14} {m:>9.0} tps  {:>+6.1}% vs none   rounds: {:?}",
                (m / base - 1.0) * 100.0,
                r.iter().map(|v| v.round() as i64).collect::<Vec<_>>()
            );
        }
    }
}
