//! Throwaway PostgreSQL clusters for `shard_directory`'s end-to-end tests, demo and benchmarks:
//! `initdb` + `pg_ctl` on free ports, as the `postgres` user when run as root, stopped on drop
//! (also when a test panics).

pub mod chart;
mod cluster;
pub mod pgbench;
pub mod pgbouncer;
pub mod redis;
pub mod topology;
mod wait;

pub use cluster::{Cluster, Frozen, Listener};
pub use topology::{reaches, Topology};
pub use wait::eventually;

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

/// The `shard-directory` CLI, built beside the test binaries (`scripts/test.sh` builds it first:
/// `cargo build -p shard-directory-mover --bin shard-directory`).
pub fn cli_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> -> target/<profile>/shard-directory
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("shard-directory");
    assert!(
        bin.exists(),
        "{} is missing: cargo build -p shard-directory-mover --bin shard-directory",
        bin.display()
    );
    bin
}
