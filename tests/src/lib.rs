//! Throwaway PostgreSQL clusters for `shard_directory`'s end-to-end tests, demo and benchmarks:
//! `initdb` + `pg_ctl` on free ports, as the `postgres` user when run as root, stopped on drop
//! (also when a test panics).

pub mod chart;
mod cluster;
pub mod mover_cli;
pub mod observe;
pub mod pgbench;
pub mod pgbouncer;
pub mod proxy;
pub mod redis;
pub mod topology;
mod wait;
pub mod wide;
pub mod workload;

pub use cluster::{Cluster, CpuTimes, Frozen, Listener};
pub use topology::{reaches, Topology};
pub use wait::{backend_pid, blocked_on, eventually, within, ANY_LOCK};

/// A benchmark's directory: a throwaway cluster with the library preloaded (as README recommends
/// for a directory) and `settings`, database `bench` with the extension and one shard
/// registered (`shard_1`, no cluster behind it), and a DBA's connection.
pub async fn bench_directory(
    name: &str,
    settings: &[(&str, &str)],
) -> (Cluster, tokio_postgres::Client) {
    let settings: Vec<_> = [("shared_preload_libraries", "shard_directory")]
        .into_iter()
        .chain(settings.iter().copied())
        .collect();
    let cluster = Cluster::start(name, &settings);
    cluster.create_database_with_extension("bench").await;
    let dba = cluster.connect("bench").await;
    dba.batch_execute("INSERT INTO shard_directory.shards (shard_name) VALUES ('shard_1')")
        .await
        .expect("register shard_1");
    (cluster, dba)
}

/// A benchmark's setting from the environment variable `name`, or `default` when it is unset;
/// a value that does not parse is an error that names the variable.
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a {}", std::any::type_name::<T>())),
        Err(_) => default,
    }
}

/// A benchmark's list of sizes from `name` (comma-separated), or `default`.
pub fn sizes(name: &str, default: &str) -> Vec<usize> {
    let list = std::env::var(name).unwrap_or_else(|_| default.into());
    list.split(',')
        .map(|n| {
            n.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}={list}: sizes separated by commas"))
        })
        .collect()
}

/// Where the benchmarks write their results: `BENCH_RESULTS` (relative to the workspace's root),
/// `bench-results/` by default.
pub fn results_dir() -> std::path::PathBuf {
    let under = std::env::var("BENCH_RESULTS").unwrap_or_else(|_| "bench-results".into());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(under);
    std::fs::create_dir_all(&dir).expect("create bench-results/");
    dir
}
