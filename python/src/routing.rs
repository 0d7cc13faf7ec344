//! `Routing` and `Route`: the Rust client's decisions for one routed transaction
//! ([`shard_directory_client::Routing`]), asked by the Python router, which runs each attempt on
//! a psycopg connection of its own.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use shard_directory_client::{Check, Rejection, Verdict};
use tokio::runtime::Runtime;

use crate::directory::Entry;
use crate::errors;

/// Where an attempt goes, with what, and for how long.
#[pyclass(frozen, module = "shard_directory._native")]
pub struct Route {
    /// The entity's entry (its shard, and while `migrating` its target).
    #[pyo3(get)]
    pub entry: Py<Entry>,
    /// The directory version the attempt is stamped with.
    #[pyo3(get)]
    pub version: i64,
    /// The attempt's number, from 1.
    #[pyo3(get)]
    pub attempt: u32,
    /// Seconds the attempt may take, the wait for a connection included.
    #[pyo3(get)]
    pub time_left: f64,
    /// The stamp's parameters (`version`, `entity_type`, `entity_id`, `left`), for
    /// [`stamp_sql`].
    #[pyo3(get)]
    pub stamp_params: Py<pyo3::types::PyDict>,
    inner: shard_directory_client::Route,
}

/// One routed transaction's attempts: `next()` for each attempt's route (a write waits out a
/// freeze there), `refused()` when a shard refused it.
#[pyclass(frozen, module = "shard_directory._native")]
pub struct Routing {
    runtime: Arc<Runtime>,
    routing: Mutex<shard_directory_client::Routing>,
}

impl Routing {
    pub fn new(runtime: Arc<Runtime>, routing: shard_directory_client::Routing) -> Routing {
        Routing {
            runtime,
            routing: Mutex::new(routing),
        }
    }
}

#[pymethods]
impl Routing {
    /// The next attempt's route. Raises `ReadOnly` when a write's entity stayed frozen past the
    /// deadline, and the lookup's errors (`UnknownEntity`, `FailClosed`, ...).
    fn next(&self, py: Python<'_>) -> PyResult<Route> {
        let (route, params) = py
            .detach(|| {
                let mut routing = self.routing.lock().expect("routing lock");
                let route = self.runtime.block_on(routing.next())?;
                let params = routing.stamp_params(&route);
                Ok::<_, shard_directory_client::Error>((route, params))
            })
            .map_err(errors::to_py)?;
        let stamp_params = pyo3::types::PyDict::new(py);
        for (name, value) in ["version", "entity_type", "entity_id", "left"]
            .into_iter()
            .zip(params)
        {
            stamp_params.set_item(name, value)?;
        }
        Ok(Route {
            entry: Py::new(py, Entry::from(&route.entry))?,
            version: route.version,
            attempt: route.attempt,
            time_left: route.time_left.as_secs_f64(),
            stamp_params: stamp_params.unbind(),
            inner: route,
        })
    }

    /// The attempt at `route` failed with SQLSTATE `sqlstate` and DETAIL `detail`. A refusal
    /// (40001) is learned from (the shard's `moved_to` when `can_route_to(shard)` says the
    /// router reaches it, else the directory re-read) and the backoff waited: returns True to
    /// run the transaction again, False to give up (the deadline, or a refusal no re-run
    /// cures). Another error is not a refusal: False. Raises `DirectoryBehind` when the shard
    /// requires a version the directory has not reached.
    fn refused(
        &self,
        py: Python<'_>,
        route: &Route,
        sqlstate: &str,
        detail: Option<&str>,
        can_route_to: Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let Some(rejection) = Rejection::from_error(sqlstate, detail) else {
            return Ok(false);
        };
        // Asked before the GIL is released: which shards the router reaches is Python's.
        let routable = match &rejection {
            Rejection::Moved { moved_to, .. } => can_route_to.call1((moved_to,))?.is_truthy()?,
            _ => false,
        };
        let verdict = py
            .detach(|| {
                let mut routing = self.routing.lock().expect("routing lock");
                self.runtime
                    .block_on(routing.refused(&route.inner, &rejection, |_| routable))
            })
            .map_err(errors::to_py)?;
        Ok(verdict == Verdict::Retry)
    }
}

/// The reason of a refusal with SQLSTATE `sqlstate` and DETAIL `detail` (`stale`, `moved`,
/// `frozen`, `missing`, `serialization`, `other`), or None when it is not a 40001.
#[pyfunction]
#[pyo3(signature = (sqlstate, detail = None))]
pub fn refusal_reason(sqlstate: &str, detail: Option<&str>) -> Option<&'static str> {
    Rejection::from_error(sqlstate, detail).map(|r| r.reason())
}

/// The stamp that opens every routed transaction, in psycopg's placeholders (its parameters are
/// a `Route`'s `stamp_params`): `check` is `write`, `read` or `unchecked`.
#[pyfunction]
pub fn stamp_sql(check: &str) -> PyResult<String> {
    let check = match check {
        "write" => Check::Write,
        "read" => Check::Read,
        "unchecked" => Check::Unchecked,
        other => {
            return Err(errors::ConfigError::new_err(format!(
                "check: {other:?} (write, read or unchecked)"
            )))
        }
    };
    let sql = shard_directory_client::Routing::stamp(check);
    // Typed, as the Rust client binds them: psycopg sends a str as unknown.
    Ok(sql
        .replace("$1", "%(version)s::text")
        .replace("$2", "%(entity_type)s::text")
        .replace("$3", "%(entity_id)s::text")
        .replace("$4", "%(left)s::text"))
}
