//! `/debug/directory` (JSON) and `/metrics` (Prometheus text) for one [`Directory`], as an axum
//! router the host application mounts, or serves on an address of its own.
//!
//! ```no_run
//! # async fn demo(directory: shard_directory_client::Directory) -> std::io::Result<()> {
//! // mounted in the application's own axum app ...
//! let app = axum::Router::new().merge(shard_directory_client::debug_http::router(directory.clone()));
//! // ... or on its own port, as in the guide: curl -s localhost:9000/debug/directory | jq .version
//! let (addr, _task) = shard_directory_client::debug_http::serve(directory, "127.0.0.1:9000".parse().unwrap()).await?;
//! # let _ = (app, addr); Ok(()) }
//! ```

use std::fmt::Write;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Json;
use serde::Serialize;

use crate::metrics::names;
use crate::{Directory, Policy, Stats};

/// The body of `/debug/directory`.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct DebugView {
    /// The directory version this instance knows (the guide's `jq .version`).
    pub version: i64,
    /// Whether the watcher's connection is up.
    pub connected: bool,
    /// When the watcher last heard from the directory, in milliseconds since the Unix epoch.
    pub last_heard_ms: Option<u64>,
    /// When the cache was last invalidated, in milliseconds since the Unix epoch.
    pub last_invalidation_ms: Option<u64>,
    /// Entries in the cache.
    pub entries: usize,
    /// The outage policy.
    pub policy: Policy,
    /// The client's counters.
    pub stats: Stats,
}

fn unix_ms(t: Option<SystemTime>) -> Option<u64> {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
}

impl DebugView {
    /// The view of `d` now.
    pub fn of(d: &Directory) -> DebugView {
        DebugView {
            version: d.version(),
            connected: d.is_connected(),
            last_heard_ms: unix_ms(d.last_heard()),
            last_invalidation_ms: unix_ms(d.last_invalidation()),
            entries: d.cached_entries(),
            policy: d.policy(),
            stats: d.stats(),
        }
    }
}

/// The client's state in the Prometheus text format.
pub fn prometheus(d: &Directory) -> String {
    let v = DebugView::of(d);
    let mut out = String::new();
    // The same names as the `metrics` facade's (`metrics::names`), so a dashboard reads either.
    let mut metric = |name: &str, kind: &str, samples: &[(&str, u64)]| {
        let name = names::prometheus(name);
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let one = |n: u64| [("", n)];
    metric(names::VERSION, "gauge", &one(v.version.max(0) as u64));
    metric(names::WATCHER_CONNECTED, "gauge", &one(v.connected as u64));
    metric(names::CACHE_ENTRIES, "gauge", &one(v.entries as u64));
    metric(names::CACHE_HITS, "counter", &one(v.stats.cache_hits));
    metric(names::CACHE_MISSES, "counter", &one(v.stats.cache_misses));
    metric(names::SERVING_STALE, "counter", &one(v.stats.serving_stale));
    metric(names::STORE_QUERIES, "counter", &one(v.stats.store_queries));
    metric(names::INVALIDATIONS, "counter", &one(v.stats.invalidations));
    metric(
        names::VERSION_REGRESSIONS,
        "counter",
        &one(v.stats.version_regressions),
    );
    metric(names::RETRIES, "counter", &one(v.stats.retries));
    let labels: Vec<(String, u64)> = v
        .stats
        .rejections
        .iter()
        .map(|(r, n)| (format!("{{reason=\"{r}\"}}"), *n))
        .collect();
    let samples: Vec<(&str, u64)> = labels.iter().map(|(l, n)| (l.as_str(), *n)).collect();
    metric(names::REJECTIONS, "counter", &samples);
    out
}

async fn debug(State(d): State<Directory>) -> Json<DebugView> {
    Json(DebugView::of(&d))
}

async fn metrics(State(d): State<Directory>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        prometheus(&d),
    )
}

/// `/debug/directory` and `/metrics`, to mount in the application's router.
pub fn router(directory: Directory) -> axum::Router {
    axum::Router::new()
        .route("/debug/directory", get(debug))
        .route("/metrics", get(metrics))
        .with_state(directory)
}

/// Serves [`router`] on `addr`; returns the bound address (useful with port 0) and the task.
pub async fn serve(
    directory: Directory,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(directory)).await {
            tracing::warn!(error = %e, "shard directory debug endpoint stopped");
        }
    });
    Ok((local, task))
}
