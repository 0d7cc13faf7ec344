//! The benchmarks of `shard_directory` (`bash scripts/bench.sh`): each a binary in `src/bin/`
//! that runs its contenders side by side in one run and prints ratios; their pgbench scripts are
//! in `pgbench/`, their results and charts in `results/`.
//!
//! - `pgbench`: a pgbench run, its TPS, rounds interleaved and paired;
//! - `chart`: SVG charts of distributions;
//! - a benchmark's settings from the environment, its directory, a tenant of a given size,
//!   onboarding churn, lookups of many tenants, where its results go.

pub mod chart;
pub mod pgbench;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use shard_directory_client::Directory;
use shard_directory_e2e::{Cluster, Topology};

/// Tenants `1` to `entries` on shard_1 in the benchmark's directory, analyzed.
pub async fn seed_tenants(dba: &tokio_postgres::Client, entries: u64) {
    dba.batch_execute(&format!(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
           SELECT 'tenant', i::text, 'shard_1' FROM generate_series(1, {entries}) i"
    ))
    .await
    .unwrap();
    dba.batch_execute("VACUUM ANALYZE").await.unwrap();
}

/// Onboarding churn: new tenants (`new-0`, `new-1`, ...) inserted into database `bench` at a
/// steady rate until [`Onboarding::stop`].
pub struct Onboarding {
    stop: Arc<AtomicBool>,
    inserted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Onboarding {
    pub async fn start(cluster: &Cluster, per_second: u64) -> Onboarding {
        let (stop, inserted) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let w = cluster.connect("bench").await;
        let task = {
            let (stop, inserted) = (stop.clone(), inserted.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second as u32);
                while !stop.load(Relaxed) {
                    tick.tick().await;
                    let id = format!("new-{}", inserted.fetch_add(1, Relaxed));
                    w.execute(
                        "INSERT INTO shard_directory.shard_directory \
                           (entity_type, entity_id, shard_name) VALUES ('tenant', $1, 'shard_1')",
                        &[&id],
                    )
                    .await
                    .unwrap();
                }
            })
        };
        Onboarding {
            stop,
            inserted,
            task,
        }
    }

    /// Stops the inserts; returns how many there were.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Relaxed);
        self.task.await.unwrap();
        self.inserted.load(Relaxed)
    }
}

/// Looks up tenants `ids` on `d`, `at_once` at a time.
pub async fn look_up(d: &Directory, ids: impl Iterator<Item = u64>, at_once: usize) {
    futures_util::stream::iter(ids)
        .map(|i| {
            let d = d.clone();
            async move { d.lookup("tenant", &i.to_string()).await.unwrap() }
        })
        .buffer_unordered(at_once)
        .for_each(|_| async {})
        .await;
}

/// A benchmark's directory: a throwaway cluster with the library preloaded (as docs/shard.md recommends
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

/// A tenant `id` of `rows` rows on shard_1 (half orders, half their lines), written with the
/// triggers off, and the tables analyzed.
pub async fn seed_tenant(t: &Topology, id: &str, rows: usize) {
    t.add_tenant(id, "shard_1").await;
    t.shard("shard_1")
        .await
        .batch_execute(&format!(
            "BEGIN; SET LOCAL session_replication_role = replica;
             INSERT INTO orders (tenant_id, item) SELECT '{id}', 'order ' || g FROM generate_series(1, {orders}) g;
             INSERT INTO order_lines (tenant_id, order_id, line_no, product)
             SELECT tenant_id, order_id, 1, item FROM orders WHERE tenant_id = '{id}';
             COMMIT; ANALYZE orders; ANALYZE order_lines",
            orders = rows / 2
        ))
        .await
        .expect("seed the tenant");
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

/// Where the benchmarks write their results: `BENCH_RESULTS` (relative to this crate's folder),
/// `results/` by default.
pub fn results_dir() -> std::path::PathBuf {
    let under = std::env::var("BENCH_RESULTS").unwrap_or_else(|_| "results".into());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(under);
    std::fs::create_dir_all(&dir).expect("create the results folder");
    dir
}

/// The key a benchmark's relay seals with, and its instances open with.
pub const RELAY_KEY: &[u8] = b"bench";

/// `shard-directory relay` on `cluster`'s `bench` database, run in this process against a Redis of
/// its own: one directory session, publishing to that Redis (its URL is the Redis's own).
pub async fn start_relay(cluster: &Cluster) -> shard_directory_e2e::redis::RedisServer {
    let redis = shard_directory_e2e::redis::RedisServer::start().await;
    let options = shard_directory_relay::RelayOptions {
        redis: redis.url(),
        channel: "shard_directory".into(),
        key: RELAY_KEY.to_vec(),
        heartbeat: Duration::from_secs(1),
    };
    let directory = cluster.config("bench");
    tokio::spawn(async move {
        shard_directory_relay::relay(&directory, &options)
            .await
            .unwrap()
    });
    redis
}
