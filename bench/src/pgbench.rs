//! pgbench runs for the side-by-side benchmarks: a run, its TPS, the median of rounds.

use std::path::{Path, PathBuf};

use shard_directory_e2e::Cluster;

/// How long each run lasts (`BENCH_SECONDS`, 10 s) and how many interleaved rounds
/// (`BENCH_ROUNDS`, 3).
pub fn settings() -> (String, usize) {
    let seconds = crate::setting("BENCH_SECONDS", 10u32).to_string();
    let rounds = crate::setting("BENCH_ROUNDS", 3);
    (seconds, rounds)
}

/// `pgbench/<name>`, this crate's pgbench scripts.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("pgbench")
        .join(name)
}

/// Runs pgbench with `args` on database `db` of `cluster`; returns its report.
pub fn run(cluster: &Cluster, db: &str, args: &[&str]) -> String {
    let out = cluster
        .client_command("pgbench")
        .args(args)
        .arg(db)
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

/// The first word after `prefix` on a line of a pgbench report, parsed.
fn reported<T: std::str::FromStr>(report: &str, prefix: &str) -> Option<T> {
    report
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The TPS of a pgbench report.
pub fn tps(report: &str) -> f64 {
    reported(report, "tps = ").expect("tps in pgbench output")
}

/// The failed transactions of a pgbench report (deadlocks and serialization failures, which
/// pgbench counts instead of stopping the client).
pub fn failed(report: &str) -> u64 {
    reported(report, "number of failed transactions: ").unwrap_or(0)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs each script in `variants` for `rounds` interleaved rounds (`-M prepared`, `clients`
/// clients, `seconds` each) and prints the median TPS of each against the first. Returns each
/// variant's TPS per round, for ratios paired round by round ([`paired`]).
pub fn compare(
    cluster: &Cluster,
    db: &str,
    title: &str,
    variants: &[(&str, PathBuf)],
    clients: &str,
    seconds: &str,
    rounds: usize,
) -> Vec<Vec<f64>> {
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut failures: Vec<Vec<u64>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (i, (_, script)) in variants.iter().enumerate() {
            let report = run(
                cluster,
                db,
                &[
                    "-n",
                    "-M",
                    "prepared",
                    "-c",
                    clients,
                    "-j",
                    clients,
                    "-T",
                    seconds,
                    "-f",
                    script.to_str().expect("a UTF-8 path"),
                ],
            );
            results[i].push(tps(&report));
            failures[i].push(failed(&report));
        }
    }
    let base = median(results[0].clone());
    for (((variant, _), r), f) in variants.iter().zip(&results).zip(&failures) {
        let m = median(r.clone());
        let failed = if f.iter().any(|f| *f > 0) {
            format!("   failed (deadlocks): {f:?}")
        } else {
            String::new()
        };
        println!(
            "{title:>10} {variant:<16} {m:>9.0} tps  {:>5.2}x of {}   rounds: {:?}{failed}",
            m / base,
            variants[0].0,
            r.iter().map(|v| v.round() as i64).collect::<Vec<_>>()
        );
    }
    results
}

/// The median of `a / b` taken round by round: each pair ran minutes apart at most, so a load
/// that drifts over the run (a shared machine's) cancels out of each ratio.
pub fn paired(a: &[f64], b: &[f64]) -> f64 {
    median(a.iter().zip(b).map(|(a, b)| a / b).collect())
}
