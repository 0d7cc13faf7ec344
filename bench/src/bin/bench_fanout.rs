//! Invalidation latency: from a directory change (the INSERT sent, committed) to every one of N
//! client instances knowing the new version, N in 1, 16, 64, 256, the instances spread over
//! four OS processes (`BENCH_PROCESSES`; this binary re-run as `worker`), each instance with its own `Directory`
//! (watcher connection, LISTEN, `changes_since`). One change at a time; p50, p99 and max over
//! `BENCH_CHANGES` changes (200) of the time the last instance took, and of every instance's
//! time. Writes every sample to `bench/results/fanout.csv` and a chart of the distribution to
//! `bench/results/fanout.svg`. The guide's figure for invalidation is ~50 ms; the goal is p99 < 10
//! ms at 256.
//!
//! Side by side, the same N as bare connections that only `LISTEN` and take the version from the
//! payload: the floor of any push design on this machine (PostgreSQL wakes every listener's
//! backend, each sends its notification). A client trusts no payload (anyone may NOTIFY), so
//! it reads `changes_since` after hearing one: the ratio is what that read costs. Both runs also
//! report the CPU time each change took, in the instances' processes and in the server: on a
//! machine with few cores, that is what bounds the latency.
//!
//! Third, the same N following the relay (`shard-directory relay`, run in this process against a
//! Redis of its own): one directory session publishes each change through Redis pub/sub, and the
//! instances hold no LISTEN connection. Reported side by side with the instances' own LISTEN, with
//! the directory sessions that carry invalidation once every instance is ready.
//!
//! Run with `bash scripts/bench.sh fanout` (`BENCH_INSTANCES`, e.g. `1,16`, picks the sizes).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use shard_directory_bench::{bench_directory, results_dir, setting, sizes, start_relay, RELAY_KEY};
use shard_directory_client::{Directory, DirectoryConfig, RelayConfig, WATCHER_APPLICATION_NAME};
use shard_directory_e2e::{Cluster, CpuTimes};
use shard_directory_relay::RELAY_APPLICATION_NAME;

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// How many worker processes the instances are spread over.
fn processes() -> usize {
    setting("BENCH_PROCESSES", 4)
}

/// What each instance of a worker is.
#[derive(Clone, Copy)]
enum Kind {
    /// A `Directory`.
    Client,
    /// A bare connection that `LISTEN`s and takes the version from the payload.
    Listen,
    /// A `Directory` that follows the relay (Redis pub/sub), not a LISTEN connection of its own.
    Relay,
}

impl Kind {
    fn arg(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Listen => "listen",
            Kind::Relay => "relay",
        }
    }
}

/// Where a worker's instances report `(instance, version)` as they learn it, stamped then.
type Heard = tokio::sync::mpsc::UnboundedSender<(usize, i64, u128)>;

/// The worker's reports as `<instance> <version> <unix ns>` lines, written by one task with one
/// write for all the lines waiting: the report is the benchmark's own cost, not the client's
/// (the bare listeners' CPU per change at 1,000 instances: 23.5 ms with a write per line, 20.0 ms
/// batched, in two runs of 2026-12-03).
fn reporter() -> Heard {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, i64, u128)>();
    tokio::spawn(async move {
        let mut lines = String::new();
        while let Some(first) = rx.recv().await {
            lines.clear();
            let mut next = Some(first);
            while let Some((i, version, at)) = next {
                lines.push_str(&format!("{i} {version} {at}\n"));
                next = rx.try_recv().ok();
            }
            let mut out = std::io::stdout().lock();
            out.write_all(lines.as_bytes()).unwrap();
            out.flush().unwrap();
        }
    });
    tx
}

/// A worker of bare listeners: prints `ready`, then `<instance> <version> <unix ns>` for each
/// notification.
async fn listener(conn: &str, instances: usize) {
    let heard = reporter();
    let mut clients = Vec::new();
    for i in 0..instances {
        let heard = heard.clone();
        let (client, mut connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(m) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = m.unwrap() {
                    let _ = heard.send((i, n.payload().parse().unwrap(), unix_ns()));
                }
            }
        });
        client
            .batch_execute("LISTEN shard_directory")
            .await
            .unwrap();
        clients.push(client);
    }
    println!("ready");
    std::future::pending::<()>().await;
}

/// A worker: `instances` directories on `conn` (following the relay at `relay` when given);
/// prints `ready`, then `<instance> <version> <unix ns>` each time an instance learns a version.
async fn worker(conn: &str, instances: usize, relay: Option<&str>) {
    let heard = reporter();
    let mut handles = Vec::new();
    let config = match relay {
        Some(url) => DirectoryConfig::default().relay(RelayConfig::new(url, RELAY_KEY.to_vec())),
        None => DirectoryConfig::default(),
    };
    for i in 0..instances {
        let d = Directory::connect(conn.parse().unwrap(), config.clone())
            .await
            .unwrap();
        let mut known = d.version_changes();
        let heard = heard.clone();
        handles.push(tokio::spawn(async move {
            let _keep = d;
            while known.changed().await.is_ok() {
                let v = *known.borrow_and_update();
                let _ = heard.send((i, v, unix_ns()));
            }
        }));
    }
    println!("ready");
    for h in handles {
        h.await.unwrap();
    }
}

/// p-quantile of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// CPU time per change, in ms: the instances' processes, the server's.
struct Cpu {
    instances: f64,
    server: f64,
}

/// What a run measured.
struct Run {
    /// Per change, every instance's latency in ms.
    per_change: Vec<Vec<f64>>,
    cpu: Cpu,
    /// The directory's sessions that carry invalidation (watchers' and the relay's) once every
    /// instance is ready.
    sessions: i64,
}

/// Runs `changes` changes against `n` instances (following the relay publishing to `redis`, for
/// [`Kind::Relay`]).
async fn run(cluster: &Cluster, kind: Kind, n: usize, changes: usize, redis: &str) -> Run {
    let (tx, rx) = mpsc::channel::<(usize, i64, u128)>();
    let mut workers = Workers(Vec::new());
    let processes = processes().min(n);
    let (ready_tx, ready_rx) = mpsc::channel();
    for p in 0..processes {
        let count = n / processes + usize::from(p < n % processes);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "worker",
                kind.arg(),
                &cluster.conn_str("bench"),
                &count.to_string(),
                redis,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, ready_tx) = (tx.clone(), ready_tx.clone());
        // Instances are numbered across processes.
        let base = p * 1_000_000;
        std::thread::spawn(move || {
            for line in out.lines() {
                let line = line.unwrap();
                if line == "ready" {
                    ready_tx.send(()).unwrap();
                    continue;
                }
                let mut f = line.split(' ');
                let mut next = || f.next().unwrap().parse::<u128>().unwrap();
                let (i, v, t) = (next(), next(), next());
                if tx.send((base + i as usize, v as i64, t)).is_err() {
                    return;
                }
            }
        });
        workers.0.push(child);
    }
    for _ in 0..processes {
        ready_rx.recv_timeout(Duration::from_secs(120)).unwrap();
    }
    let c = cluster.connect("bench").await;
    let sessions: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name IN ($1, $2)",
            &[&WATCHER_APPLICATION_NAME, &RELAY_APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    let insert = c
        .prepare(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', $1, 'shard_1')",
        )
        .await
        .unwrap();
    let version = c
        .prepare("SELECT shard_directory.current_version()")
        .await
        .unwrap();
    let pids: Vec<u32> = workers.0.iter().map(Child::id).collect();
    let before = (CpuTimes::of(pids.clone()), cluster.cpu_times());
    let mut per_change = Vec::new();
    for k in 0..changes {
        let started = unix_ns();
        c.execute(&insert, &[&format!("{}-{n}-{k}", kind.arg())])
            .await
            .unwrap();
        let v: i64 = c.query_one(&version, &[]).await.unwrap().get(0);
        let mut seen: HashMap<usize, f64> = HashMap::new();
        while seen.len() < n {
            let (i, at, t) = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("{} of {n} instances saw version {v}", seen.len()));
            if at >= v {
                seen.entry(i)
                    .or_insert((t.saturating_sub(started)) as f64 / 1e6);
            }
        }
        per_change.push(seen.into_values().collect());
    }
    let per = |used: Duration| used.as_secs_f64() * 1e3 / changes as f64;
    let cpu = Cpu {
        instances: per(CpuTimes::of(pids).since(&before.0)),
        server: per(cluster.cpu_times().since(&before.1)),
    };
    Run {
        per_change,
        cpu,
        sessions,
    }
}

/// The slowest instance's latency of each change, sorted.
fn slowest(per_change: &[Vec<f64>]) -> Vec<f64> {
    let mut last: Vec<f64> = per_change
        .iter()
        .map(|c| c.iter().copied().fold(0.0, f64::max))
        .collect();
    last.sort_by(f64::total_cmp);
    last
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        let (conn, count) = (&args[3], args[4].parse().unwrap());
        return match args[2].as_str() {
            "listen" => listener(conn, count).await,
            "relay" => worker(conn, count, args.get(5).map(String::as_str)).await,
            _ => worker(conn, count, None).await,
        };
    }
    let sizes = sizes("BENCH_INSTANCES", "1,16,64,256");
    let changes: usize = setting("BENCH_CHANGES", 200);
    let most = sizes.iter().max().copied().unwrap_or(1);
    // Two connections per instance (the watcher's and one store connection), the listeners of
    // the run before, which may not have gone yet, and room to spare.
    let connections = (3 * most + 20).to_string();
    let (cluster, _) = bench_directory("bench-fanout", &[("max_connections", &connections)]).await;
    let redis = start_relay(&cluster).await;
    let mut relay_rows = Vec::new();
    println!(
        "invalidation latency, ms from the change sent to the instances knowing its version \
         ({changes} changes, instances over {} processes)",
        processes()
    );
    println!(
        "| instances | LISTEN only, all heard: p50 | p99 | this client, all know: p50 | p99 | max | \
         each instance: p50 | p99 | max | p99 / LISTEN only |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut csv = String::from("instances,change,latency_ms\n");
    let mut series = Vec::new();
    let mut cpu_rows = Vec::new();
    for n in sizes {
        let url = redis.url();
        let floor_run = run(&cluster, Kind::Listen, n, changes, &url).await;
        let (floor, floor_cpu) = (slowest(&floor_run.per_change), floor_run.cpu);
        let direct = run(&cluster, Kind::Client, n, changes, &url).await;
        let relayed = run(&cluster, Kind::Relay, n, changes, &url).await;
        let (per_change, cpu) = (direct.per_change, direct.cpu);
        let through = slowest(&relayed.per_change);
        let mut each: Vec<f64> = relayed.per_change.iter().flatten().copied().collect();
        each.sort_by(f64::total_cmp);
        relay_rows.push(format!(
            "| {n} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x | {} | {} | {:.2} | {:.2} |",
            quantile(&slowest(&per_change), 0.99),
            quantile(&through, 0.5),
            quantile(&through, 0.99),
            quantile(&through, 1.0),
            quantile(&each, 0.99),
            quantile(&through, 0.99) / quantile(&slowest(&per_change), 0.99),
            direct.sessions,
            relayed.sessions,
            relayed.cpu.instances,
            relayed.cpu.server,
        ));
        cpu_rows.push(format!(
            "| {n} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x |",
            floor_cpu.instances,
            floor_cpu.server,
            cpu.instances,
            cpu.server,
            (cpu.instances + cpu.server) / (floor_cpu.instances + floor_cpu.server),
        ));
        let last = slowest(&per_change);
        let mut each: Vec<f64> = per_change.iter().flatten().copied().collect();
        for (k, c) in per_change.iter().enumerate() {
            for l in c {
                csv.push_str(&format!("{n},{k},{l:.3}\n"));
            }
        }
        each.sort_by(f64::total_cmp);
        println!(
            "| {n} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x |",
            quantile(&floor, 0.5),
            quantile(&floor, 0.99),
            quantile(&last, 0.5),
            quantile(&last, 0.99),
            quantile(&last, 1.0),
            quantile(&each, 0.5),
            quantile(&each, 0.99),
            quantile(&each, 1.0),
            quantile(&last, 0.99) / quantile(&floor, 0.99),
        );
        series.push((n, last));
    }
    println!(
        "\nCPU time per change, ms (user and system; {} cores: a change that takes more CPU than \
         cores x latency cannot be done in that latency)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "| instances | LISTEN only: listeners | server | this client: instances | server | \
         total / LISTEN only |"
    );
    println!("|---|---|---|---|---|---|");
    for row in cpu_rows {
        println!("{row}");
    }
    println!(
        "\nthrough the relay (`shard-directory relay`, Redis pub/sub), ms from the change sent to \
         every instance knowing its version, side by side with each instance's own LISTEN"
    );
    println!(
        "| instances | own LISTEN, all know: p99 | relay, all know: p50 | p99 | max | each \
         instance: p99 | relay p99 / own LISTEN p99 | directory sessions for invalidation: own \
         LISTEN | relay | CPU per change, ms: instances | server |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for row in relay_rows {
        println!("{row}");
    }
    let dir = results_dir();
    std::fs::write(dir.join("fanout.csv"), csv).unwrap();
    shard_directory_bench::chart::cdf(
        &dir.join("fanout.svg"),
        "COMMIT to every instance knowing the version",
        "ms until the last instance knew",
        &series,
    );
    println!(
        "samples: {}; chart: {}",
        dir.join("fanout.csv").display(),
        dir.join("fanout.svg").display()
    );
}
