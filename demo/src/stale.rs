//! The demo's deliberately stale application instance, in a process of its own: no LISTEN and an
//! hour between polls, so it learns of a move only when a shard refuses it. Its own process so
//! that it has its own metrics recorder and `/metrics` (a Prometheus exporter, as an application
//! installs one), whose rejection count the demo reads as the guide's verification asks (the
//! stale client is refused, and the rejection metric increments).
//!
//! The demo runs this binary again with `stale-instance` and talks to it over stdin/stdout, one
//! line each way: `write <tenant> <item>` (the router with its retries), `once <tenant> <item>`
//! (no retry: the shard's answer itself), `route <tenant>` (the shard and version it would use).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use shard_directory_client::metrics::names;
use shard_directory_client::{Directory, DirectoryConfig, Error, RetryPolicy, Router, ShardConfig};
use shard_directory_e2e::topology::{DIRECTORY_DB, SHARD_DB};
use shard_directory_e2e::workload::write_order;
use shard_directory_e2e::Topology;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

pub const ARG: &str = "stale-instance";
const DIRECTORY: &str = "SD_DEMO_DIRECTORY";
const SHARDS: &str = "SD_DEMO_SHARDS";
const METRICS: &str = "SD_DEMO_METRICS";

/// The parent's handle on the stale instance; the process is killed when it drops.
pub struct StaleInstance {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pub metrics: SocketAddr,
    pub debug: SocketAddr,
}

impl StaleInstance {
    /// Starts it on `t` and waits until it has written one order of `tenant` (so that its cache
    /// holds the tenant's entry, and goes stale from there).
    pub async fn start(t: &Topology, tenant: &str) -> StaleInstance {
        let metrics: SocketAddr = {
            let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            free.local_addr().unwrap()
        };
        let shards: Vec<String> = t
            .shards
            .iter()
            .map(|(name, c)| format!("{name}={}", c.conn_str(SHARD_DB)))
            .collect();
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("the demo"))
            .arg(ARG)
            .env(DIRECTORY, t.directory.conn_str(DIRECTORY_DB))
            .env(SHARDS, shards.join(";"))
            .env(METRICS, metrics.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the stale instance");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut stale = StaleInstance {
            _child: child,
            stdin,
            stdout,
            metrics,
            debug: metrics,
        };
        stale.debug = stale
            .read()
            .await
            .strip_prefix("debug ")
            .and_then(|a| a.parse().ok())
            .expect("the stale instance's debug address");
        let first = stale.ask(&format!("write {tenant} stale-1")).await;
        assert_eq!(first, "committed", "the stale instance's first write");
        stale
    }

    async fn read(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(30), self.stdout.next_line())
            .await
            .expect("the stale instance answers within 30 s")
            .expect("read the stale instance")
            .expect("the stale instance is running")
    }

    /// Sends one command; returns its one-line answer.
    pub async fn ask(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to the stale instance");
        self.read().await
    }

    /// The rejection counter for `reason` from its `/metrics` (absent until the first one: 0),
    /// and the exporter's line as printed.
    pub async fn rejections(&self, reason: &str) -> (u64, String) {
        let body = super::curl(&format!("http://{}/metrics", self.metrics)).await;
        let prefix = format!("{}{{reason=\"{reason}\"}} ", names::REJECTIONS);
        String::from_utf8_lossy(&body)
            .lines()
            .find(|l| l.starts_with(&prefix))
            .map(|l| {
                let n = l[prefix.len()..].trim().parse().unwrap_or(0);
                (n, l.to_owned())
            })
            .unwrap_or((0, format!("(no {} line yet: 0)", names::REJECTIONS)))
    }
}

/// The child's side: runs until its stdin closes.
pub async fn run() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let metrics: SocketAddr = var(METRICS).parse().expect("a socket address");
    // Before the directory connects: the client registers its counters with the recorder there.
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(metrics)
        .install()
        .expect("install the Prometheus exporter");
    let directory = Directory::connect(
        var(DIRECTORY).parse().expect("a directory conninfo"),
        DirectoryConfig::default()
            .listen(false)
            .poll_interval(Duration::from_secs(3600)),
    )
    .await
    .expect("connect to the directory");
    let (debug, _task) = shard_directory_client::debug_http::serve(
        directory.clone(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .expect("serve /debug/directory");
    let shards: Vec<ShardConfig> = var(SHARDS)
        .split(';')
        .map(|s| {
            let (name, conn) = s.split_once('=').expect("name=conninfo");
            ShardConfig::new(name, conn.parse().expect("a shard conninfo"))
        })
        .collect();
    let router = Router::new(directory.clone(), shards.clone()).expect("router");
    let once = Router::new(directory, shards)
        .expect("router")
        .with_retry(RetryPolicy::default().deadline(Duration::ZERO));
    println!("debug {debug}");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["write", tenant, item] => outcome(write_order(&router, tenant, item).await),
            ["once", tenant, item] => outcome(write_order(&once, tenant, item).await),
            ["route", tenant] => match router.directory().lookup("tenant", tenant).await {
                Ok(e) => format!("{} {}", e.shard_name, router.directory().version()),
                Err(e) => format!("failed {e}"),
            },
            _ => format!("failed unknown command {line:?}"),
        };
        println!("{answer}");
    }
}

/// One line: `committed`, `refused <SQLSTATE>\t<message>\t<detail>\t<hint>`, or `failed <error>`.
fn outcome(result: Result<(), Error>) -> String {
    match result {
        Ok(()) => "committed".into(),
        Err(Error::Rejected { source, .. }) => {
            let db = source.as_db_error();
            format!(
                "refused {}\t{}\t{}\t{}",
                db.map_or("?", |d| d.code().code()),
                db.map_or("", |d| d.message()),
                db.and_then(|d| d.detail()).unwrap_or(""),
                db.and_then(|d| d.hint()).unwrap_or("")
            )
        }
        Err(e) => format!("failed {e}"),
    }
}
