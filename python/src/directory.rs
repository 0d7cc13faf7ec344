//! `Directory`: the Rust client's [`shard_directory_client::Directory`] (its cache, watcher,
//! relay, replicas, shared cache and epoch) on a runtime of its own, whose threads end with
//! `close()`. Every call that may wait releases the GIL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use shard_directory_client::{
    DirectoryConfig, EntityKey, Entry as RustEntry, Policy, RelayConfig, RetryPolicy,
    SharedCacheConfig, Statements,
};
use tokio::runtime::Runtime;

use crate::entity;
use crate::errors::{self, ConfigError};
use crate::routing::Routing;
use crate::wait::wait;

/// An entry of the directory, as a lookup returned it.
#[pyclass(frozen, get_all, module = "shard_directory")]
pub struct Entry {
    /// The shard that owns the entity.
    pub shard_name: String,
    /// While `migrating` or `read_only`: the shard it is moving to.
    pub target_shard: Option<String>,
    /// `active`, `migrating` or `read_only`.
    pub state: String,
    pub region: Option<String>,
    /// The entry's own version (the directory version of its last change).
    pub version: i64,
    /// The directory version it was read at.
    pub directory_version: i64,
}

impl From<&RustEntry> for Entry {
    fn from(e: &RustEntry) -> Entry {
        Entry {
            shard_name: e.shard_name.to_string(),
            target_shard: e.target_shard.map(|t| t.to_string()),
            state: e.state.as_str().to_owned(),
            region: e.region.map(|r| r.to_string()),
            version: e.version,
            directory_version: e.directory_version,
        }
    }
}

#[pymethods]
impl Entry {
    fn __repr__(&self) -> String {
        let text = |t: &Option<String>| t.as_ref().map_or("None".to_owned(), |t| format!("'{t}'"));
        format!(
            "Entry(shard_name='{}', target_shard={}, state='{}', region={}, version={}, \
             directory_version={})",
            self.shard_name,
            text(&self.target_shard),
            self.state,
            text(&self.region),
            self.version,
            self.directory_version
        )
    }

    fn __eq__(&self, other: &Entry) -> bool {
        (
            &self.shard_name,
            &self.target_shard,
            &self.state,
            &self.region,
            self.version,
        ) == (
            &other.shard_name,
            &other.target_shard,
            &other.state,
            &other.region,
            other.version,
        )
    }
}

/// The runtime the client's tasks run on, and the client; `None` once closed.
pub struct Open {
    pub runtime: Arc<Runtime>,
    pub directory: shard_directory_client::Directory,
}

/// A connected directory client.
#[pyclass(frozen, module = "shard_directory._native")]
pub struct Directory {
    open: Mutex<Option<Open>>,
}

/// `s` seconds; `ConfigError` naming `what` when negative or not a number.
fn seconds(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| ConfigError::new_err(format!("{what}: {s} s")))
}

/// `s`, a libpq connection string, parsed; `ConfigError` naming `what` when it does not.
fn parse_conninfo(s: &str, what: &str) -> PyResult<tokio_postgres::Config> {
    s.parse()
        .map_err(|e| ConfigError::new_err(format!("{what}: {e}")))
}

impl Directory {
    /// The runtime and the client, or `ConfigError` once closed.
    pub fn with_open<R>(
        &self,
        f: impl FnOnce(&Arc<Runtime>, &shard_directory_client::Directory) -> R,
    ) -> PyResult<R> {
        let open = self.open.lock().expect("open lock");
        match &*open {
            Some(o) => Ok(f(&o.runtime, &o.directory)),
            None => Err(ConfigError::new_err("the directory client is closed")),
        }
    }

    /// The entry when the cache answers without a round trip.
    fn cached(&self, entity_type: &str, entity_id: &str) -> PyResult<Option<Entry>> {
        self.with_open(|_, d| d.lookup_cached(entity_type, entity_id))?
            .transpose()
            .map(|e| e.map(|e| Entry::from(&e)))
            .map_err(errors::to_py)
    }
}

#[pymethods]
impl Directory {
    /// Connects to the directory at `conninfo` (a libpq connection string) and starts its
    /// watcher; see the package's README for each setting.
    #[new]
    #[pyo3(signature = (
        conninfo,
        *,
        listen = true,
        listen_conninfo = None,
        poll_interval = 30.0,
        connect_timeout = 5.0,
        query_timeout = 5.0,
        policy = "serve_from_cache",
        pooled = false,
        pool_size = None,
        max_cached_entries = None,
        replicas = Vec::new(),
        replica_wait = None,
        relay_url = None,
        relay_key = None,
        relay_silence = None,
        shared_cache_url = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        conninfo: &str,
        listen: bool,
        listen_conninfo: Option<&str>,
        poll_interval: f64,
        connect_timeout: f64,
        query_timeout: f64,
        policy: &str,
        pooled: bool,
        pool_size: Option<usize>,
        max_cached_entries: Option<usize>,
        replicas: Vec<String>,
        replica_wait: Option<f64>,
        relay_url: Option<String>,
        relay_key: Option<Vec<u8>>,
        relay_silence: Option<f64>,
        shared_cache_url: Option<String>,
    ) -> PyResult<Directory> {
        let config = parse_conninfo(conninfo, "conninfo")?;
        let mut settings = DirectoryConfig::default()
            .listen(listen)
            .poll_interval(seconds(poll_interval, "poll_interval")?)
            .connect_timeout(seconds(connect_timeout, "connect_timeout")?)
            .query_timeout(seconds(query_timeout, "query_timeout")?)
            .policy(match policy {
                "serve_from_cache" => Policy::ServeFromCache,
                "fail_closed" => Policy::FailClosed,
                other => {
                    return Err(ConfigError::new_err(format!(
                        "policy: {other:?} (serve_from_cache or fail_closed)"
                    )))
                }
            });
        if let Some(listen_conninfo) = listen_conninfo {
            settings = settings.listen_config(parse_conninfo(listen_conninfo, "listen_conninfo")?);
        }
        if pooled {
            settings = settings.statements(Statements::Unnamed);
        }
        if let Some(size) = pool_size {
            settings = settings.store_pool_size(size);
        }
        if let Some(max) = max_cached_entries {
            settings = settings.max_cached_entries(max);
        }
        for replica in &replicas {
            settings = settings.replica(parse_conninfo(replica, "replicas")?);
        }
        if let Some(wait) = replica_wait {
            settings = settings.replica_wait(seconds(wait, "replica_wait")?);
        }
        match (relay_url, relay_key) {
            (Some(url), Some(key)) => {
                let mut relay = RelayConfig::new(url, key);
                if let Some(silence) = relay_silence {
                    relay = relay.silence(seconds(silence, "relay_silence")?);
                }
                settings = settings.relay(relay);
            }
            (None, None) => {}
            _ => return Err(ConfigError::new_err("relay_url and relay_key go together")),
        }
        if let Some(url) = shared_cache_url {
            settings = settings.shared_cache(SharedCacheConfig::new(url));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shard-directory")
            .enable_all()
            .build()
            .map_err(|e| ConfigError::new_err(format!("the client's runtime: {e}")))?;
        let patience = settings.connect_timeout;
        let connected = wait(py, &runtime, async {
            let directory = shard_directory_client::Directory::connect(config, settings).await?;
            // Ready means its watcher (or relay) is connected: until then every lookup reads
            // the directory. A watcher that cannot connect within the connect timeout leaves it
            // so (it goes on trying), not failed.
            let connected = async {
                while !directory.is_connected() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            };
            let _ = tokio::time::timeout(patience, connected).await;
            Ok(directory)
        });
        let directory = connected?.map_err(errors::to_py)?;
        Ok(Directory {
            open: Mutex::new(Some(Open {
                runtime: Arc::new(runtime),
                directory,
            })),
        })
    }

    /// The entity's entry: from the cache when current (without releasing the GIL: it does not
    /// wait), else from the directory.
    fn lookup(
        &self,
        py: Python<'_>,
        entity_type: &Bound<'_, PyAny>,
        entity_id: &Bound<'_, PyAny>,
    ) -> PyResult<Entry> {
        let (entity_type, entity_id) = entity::key(entity_type, entity_id)?;
        if let Some(cached) = self.cached(&entity_type, &entity_id)? {
            return Ok(cached);
        }
        let (runtime, directory) = self.with_open(|r, d| (r.clone(), d.clone()))?;
        wait(py, &runtime, directory.lookup(&entity_type, &entity_id))?
            .map(|e| Entry::from(&e))
            .map_err(errors::to_py)
    }

    /// The entity's entry when the cache answers without a round trip; None when a lookup would
    /// read the directory (an event loop's lookup then reads it on a thread).
    fn lookup_cached(
        &self,
        entity_type: &Bound<'_, PyAny>,
        entity_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Entry>> {
        let (entity_type, entity_id) = entity::key(entity_type, entity_id)?;
        self.cached(&entity_type, &entity_id)
    }

    /// The directory version this client knows.
    #[getter]
    fn version(&self) -> PyResult<i64> {
        self.with_open(|_, d| d.version())
    }

    /// Whether the watcher's connection (or the relay) is up.
    #[getter]
    fn connected(&self) -> PyResult<bool> {
        self.with_open(|_, d| d.is_connected())
    }

    /// Whether notifications reach the watcher (it heard its own probe).
    #[getter]
    fn listening(&self) -> PyResult<bool> {
        self.with_open(|_, d| d.is_listening())
    }

    /// Reads what changed in the directory now; returns the version.
    fn refresh(&self, py: Python<'_>) -> PyResult<i64> {
        let (runtime, directory) = self.with_open(|r, d| (r.clone(), d.clone()))?;
        wait(py, &runtime, directory.refresh())?.map_err(errors::to_py)
    }

    /// Waits up to `timeout` seconds until this client knows `version` or a later one (after a
    /// change the application made itself); returns whether it does.
    fn wait_for_version(&self, py: Python<'_>, version: i64, timeout: f64) -> PyResult<bool> {
        let timeout = seconds(timeout, "timeout")?;
        let (runtime, directory) = self.with_open(|r, d| (r.clone(), d.clone()))?;
        // The timer is made on the runtime, inside the future.
        let known =
            async { tokio::time::timeout(timeout, directory.wait_for_version(version)).await };
        Ok(wait(py, &runtime, known)?.is_ok())
    }

    /// The `/debug/directory` view (the version, the watcher, the counters), as JSON.
    fn debug_json(&self) -> PyResult<String> {
        let view = self.with_open(|_, d| shard_directory_client::debug_http::DebugView::of(d))?;
        serde_json::to_string(&view).map_err(|e| ConfigError::new_err(e.to_string()))
    }

    /// Serves `/debug/directory` on `address` (`host:port`; port 0 picks one) until `close()`;
    /// returns the address bound.
    fn serve_debug(&self, py: Python<'_>, address: &str) -> PyResult<String> {
        let addr = address
            .parse()
            .map_err(|e| ConfigError::new_err(format!("address {address:?}: {e}")))?;
        let (runtime, directory) = self.with_open(|r, d| (r.clone(), d.clone()))?;
        let (bound, _task) = py
            .detach(|| runtime.block_on(shard_directory_client::debug_http::serve(directory, addr)))
            .map_err(|e| ConfigError::new_err(format!("serve on {address}: {e}")))?;
        Ok(bound.to_string())
    }

    /// Where `shard` is, from the directory's registry (`shards.conninfo`), if it says.
    fn shard_conninfo(&self, py: Python<'_>, shard: &str) -> PyResult<Option<String>> {
        let (runtime, directory) = self.with_open(|r, d| (r.clone(), d.clone()))?;
        wait(py, &runtime, directory.shard_conninfo(shard))?.map_err(errors::to_py)
    }

    /// The attempts of one routed transaction (see `Routing`).
    #[pyo3(signature = (entity_type, entity_id, *, write, deadline, attempt_timeout, base_backoff, max_backoff))]
    #[allow(clippy::too_many_arguments)]
    fn routing(
        &self,
        entity_type: &Bound<'_, PyAny>,
        entity_id: &Bound<'_, PyAny>,
        write: bool,
        deadline: f64,
        attempt_timeout: f64,
        base_backoff: f64,
        max_backoff: f64,
    ) -> PyResult<Routing> {
        let policy = RetryPolicy::default()
            .deadline(seconds(deadline, "deadline")?)
            .attempt_timeout(seconds(attempt_timeout, "attempt_timeout")?)
            .base_backoff(seconds(base_backoff, "base_backoff")?)
            .max_backoff(seconds(max_backoff, "max_backoff")?);
        let (entity_type, entity_id) = entity::key(entity_type, entity_id)?;
        let key = EntityKey::new(&*entity_type, &*entity_id);
        self.with_open(|runtime, directory| {
            Routing::new(
                Arc::downgrade(runtime),
                shard_directory_client::Routing::new(directory, key, policy, write),
            )
        })
    }

    /// Stops the watcher and the client's threads; the client cannot be used after.
    fn close(&self, py: Python<'_>) {
        let open = self.open.lock().expect("open lock").take();
        if let Some(Open { runtime, directory }) = open {
            drop(directory);
            // A `Routing` holds the runtime only while it waits on it: the one still waiting
            // ends it when it returns.
            if let Ok(runtime) = Arc::try_unwrap(runtime) {
                py.detach(|| runtime.shutdown_timeout(Duration::from_secs(5)));
            }
        }
    }

    #[getter]
    fn closed(&self) -> bool {
        self.open.lock().expect("open lock").is_none()
    }
}
