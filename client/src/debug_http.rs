//! `/debug/directory` (JSON) for one [`Directory`], as an axum router the host application
//! mounts, or serves on an address of its own. Metrics go through the `metrics` facade to the
//! recorder the application installs (e.g. `metrics-exporter-prometheus`), not through here.
//!
//! ```no_run
//! # async fn demo(directory: shard_directory_client::Directory) -> std::io::Result<()> {
//! // mounted in the application's own axum app ...
//! let app = axum::Router::new().merge(shard_directory_client::debug_http::router(directory.clone()));
//! // ... or on its own port, as in the guide: curl -s localhost:9000/debug/directory | jq .version
//! let (addr, _task) = shard_directory_client::debug_http::serve(directory, "127.0.0.1:9000".parse().unwrap()).await?;
//! # let _ = (app, addr); Ok(()) }
//! ```

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::routing::get;
use axum::Json;
use serde::Serialize;

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

async fn debug(State(d): State<Directory>) -> Json<DebugView> {
    Json(DebugView::of(&d))
}

/// `/debug/directory`, to mount in the application's router.
pub fn router(directory: Directory) -> axum::Router {
    axum::Router::new()
        .route("/debug/directory", get(debug))
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
