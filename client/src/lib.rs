//! Client side of `shard_directory`: route each tenant's work to the shard the directory names,
//! safely.
//!
//! - [`Directory`]: lookups from an in-process cache tagged with the directory version, misses
//!   from the directory database, push invalidation (`LISTEN shard_directory`) with a slow poll
//!   fallback, and a [`Policy`] for when the directory is unreachable.
//! - [`Router`]: one connection pool per shard; runs a closure as one transaction stamped with the
//!   client's directory version, and re-runs it when the shard refuses a stale route (SQLSTATE
//!   40001), using the shard's `moved_to` hint when it gives one.
//! - Metrics through the `metrics` facade, logs through `tracing`; with feature `debug-http`, an
//!   axum router serving `/debug/directory` and `/metrics`.
//! - With feature `redis`, the guide's shared middle cache, keyed by directory version.

#![warn(missing_docs)]

mod backoff;
mod cache;
#[cfg(feature = "debug-http")]
pub mod debug_http;
mod directory;
mod entry;
mod error;
pub mod metrics;
mod policy;
mod pool;
mod rejection;
mod router;
#[cfg(feature = "redis")]
mod shared_cache;
mod store;
mod watcher;

#[cfg(feature = "test-hooks")]
pub use directory::FillHook;
pub use directory::{Directory, DirectoryConfig};
pub use entry::{EntityKey, Entry, State, UnknownState};
pub use error::{Error, Result};
pub use metrics::Stats;
pub use policy::Policy;
pub use rejection::Rejection;
pub use router::{Reads, RetryPolicy, Router, ShardConfig, TxOptions};
#[cfg(feature = "redis")]
pub use shared_cache::SharedCacheConfig;
pub use tokio_postgres::IsolationLevel;
pub use watcher::APPLICATION_NAME as WATCHER_APPLICATION_NAME;
