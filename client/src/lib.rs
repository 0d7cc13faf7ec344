//! Client side of `shard_directory`: route each tenant's work to the shard the directory names,
//! safely.
//!
//! - [`Directory`]: lookups from an in-process cache tagged with the directory version, misses
//!   from the directory database, push invalidation (`LISTEN shard_directory`) with a slow poll
//!   fallback, and a [`Policy`] for when the directory is unreachable.
//! - [`Router`]: one connection pool per shard; runs a closure as one transaction stamped with the
//!   client's directory version, and re-runs it when the shard refuses a stale route (SQLSTATE
//!   40001), using the shard's `moved_to` hint when it gives one.
//! - [`Routing`]: the router's decisions without its connections (where each attempt goes, with
//!   which stamp, what a refusal teaches), for an application that runs the transactions on
//!   connections of its own.
//! - Metrics through the `metrics` facade (the application installs the recorder), logs through
//!   `tracing`; with feature `debug-http`, an axum router serving `/debug/directory`.
//! - With feature `redis`, the guide's shared middle cache: entries other instances read, taken
//!   when the change log (`change_log`) says they did not change since.
//! - With feature `native-tls`, TLS on every connection, as each connection string's `sslmode`
//!   asks.
//!
//! Modules: `directory` (lookups, fills, the outage policy in `policy`) over `cache` (entries
//! tagged with versions; its key in `cache_key`, its map in `cache_map`, what changed in
//! `change_log`, names interned in `name`), `store` (the directory's queries) and `watcher`
//! (LISTEN, the poll, `changes_since`); `router` (its own index) over `routing` (its decisions), with `rejection` (a shard's 40001 read); `pool` (bounded
//! connections) and `statements` (prepared once per connection); `backoff`; `entry` (an entry,
//! and the protocol's key and state); `error`; `metrics`; `debug_http`; `shared_cache`. The
//! wire contract with the extension is the `shard-directory-protocol` crate.

#![warn(missing_docs)]

/// Chainable setters for a `#[non_exhaustive]` config struct (built as
/// `DirectoryConfig::default().listen(false)`, since struct update syntax is refused outside
/// this crate).
macro_rules! setters {
    ($ty:ty { $($field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets `", stringify!($field), "`.")]
                pub fn $field(mut self, $field: $t) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

/// The TLS connector a config struct's `tls` field asks for (the field exists with feature
/// `native-tls`; without it, plaintext).
macro_rules! connector_of {
    ($config:expr) => {{
        #[cfg(feature = "native-tls")]
        let connector = crate::pool::Connector::new($config.tls.as_ref());
        #[cfg(not(feature = "native-tls"))]
        let connector: crate::error::Result<_> = Ok(crate::pool::Connector::Plain);
        connector
    }};
}

mod backoff;
mod cache;
mod cache_key;
mod cache_map;
mod change_log;
#[cfg(feature = "debug-http")]
pub mod debug_http;
mod directory;
mod entry;
mod error;
pub mod metrics;
mod name;
mod policy;
mod pool;
mod rejection;
#[cfg(feature = "redis")]
mod relay;
mod replicas;
mod router;
mod routing;
#[cfg(feature = "redis")]
mod shared_cache;
mod statements;
mod store;
mod watcher;

#[cfg(feature = "test-hooks")]
pub use directory::FillHook;
pub use directory::{Directory, DirectoryConfig};
pub use entry::{EntityKey, Entry, State, UnknownState};
pub use error::{AbortCause, Error, Result};
pub use metrics::Stats;
pub use name::Name;
/// The TLS crate of `DirectoryConfig::tls` and `ShardConfig::tls` (feature `native-tls`).
#[cfg(feature = "native-tls")]
pub use native_tls;
pub use policy::Policy;
pub use rejection::Rejection;
#[cfg(feature = "redis")]
pub use relay::RelayConfig;
pub use router::{Reads, RetryPolicy, Router, ShardConfig, TxOptions};
pub use routing::{Check, Route, Routing, Verdict};
pub use shard_directory_protocol::WATCHER_APPLICATION_NAME;
#[cfg(feature = "redis")]
pub use shared_cache::SharedCacheConfig;
pub use statements::Statements;
pub use tokio_postgres::IsolationLevel;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
