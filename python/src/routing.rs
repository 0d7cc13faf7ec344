//! `Routing` and `Route`: the Rust client's decisions for one routed transaction
//! ([`shard_directory_client::Routing`]), asked by the Python router, which runs each attempt on
//! a psycopg connection of its own.

use std::sync::{Arc, Weak};

use pyo3::prelude::*;
use shard_directory_client::{Check, Rejection, Verdict};
use tokio::runtime::Runtime;

use crate::directory::Entry;
use crate::errors;
use crate::wait::wait;

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
    /// The directory's runtime, held only while waiting on it: a `Routing` kept (by an error's
    /// traceback, say) does not keep the client's threads past `close()`.
    runtime: Weak<Runtime>,
    routing: Arc<tokio::sync::Mutex<shard_directory_client::Routing>>,
}

/// A decision being made on the runtime for an event loop (`next_soon`, `refused_soon`).
#[pyclass(frozen, module = "shard_directory._native")]
pub struct Pending(tokio::task::AbortHandle);

#[pymethods]
impl Pending {
    /// Stops it (its task awaiting it was cancelled): a wait out a freeze or a backoff ends.
    fn cancel(&self) {
        self.0.abort();
    }
}

/// The Python `Route` of `route`.
fn route_of(
    py: Python<'_>,
    route: shard_directory_client::Route,
    params: [String; 4],
) -> PyResult<Route> {
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

/// Calls `done(ok, value)` with what `made` gave: the value, or the exception.
fn settle(py: Python<'_>, done: &Py<PyAny>, made: PyResult<Py<PyAny>>) {
    let (ok, value) = match made {
        Ok(value) => (true, value),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    if let Err(e) = done.call1(py, (ok, value)) {
        e.write_unraisable(py, None);
    }
}

impl Routing {
    pub fn new(runtime: Weak<Runtime>, routing: shard_directory_client::Routing) -> Routing {
        Routing {
            runtime,
            routing: Arc::new(tokio::sync::Mutex::new(routing)),
        }
    }

    /// The routing, to this call alone: a transaction's attempts are one caller's.
    fn one_at_a_time(
        &self,
    ) -> PyResult<tokio::sync::OwnedMutexGuard<shard_directory_client::Routing>> {
        self.routing
            .clone()
            .try_lock_owned()
            .map_err(|_| errors::ConfigError::new_err("a Routing is used by one caller at a time"))
    }

    /// What a refusal is (`None`: not a 40001), and whether its `moved_to` is routable, asked
    /// of `can_route_to` with the GIL held (which shards the router reaches is Python's).
    fn refusal(
        sqlstate: &str,
        detail: Option<&str>,
        can_route_to: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Rejection, bool)>> {
        let Some(rejection) = Rejection::from_error(sqlstate, detail) else {
            return Ok(None);
        };
        let routable = match &rejection {
            Rejection::Moved { moved_to, .. } => can_route_to.call1((moved_to,))?.is_truthy()?,
            _ => false,
        };
        Ok(Some((rejection, routable)))
    }

    /// The runtime, or `ConfigError` once the directory client is closed.
    fn runtime(&self) -> PyResult<Arc<Runtime>> {
        self.runtime
            .upgrade()
            .ok_or_else(|| errors::ConfigError::new_err("the directory client is closed"))
    }
}

#[pymethods]
impl Routing {
    /// The next attempt's route. Raises `ReadOnly` when a write's entity stayed frozen past the
    /// deadline, and the lookup's errors (`UnknownEntity`, `FailClosed`, ...).
    fn next(&self, py: Python<'_>) -> PyResult<Route> {
        let runtime = self.runtime()?;
        let mut routing = self.one_at_a_time()?;
        let route = wait(py, &runtime, routing.next())?.map_err(errors::to_py)?;
        let params = routing.stamp_params(&route);
        route_of(py, route, params)
    }

    /// `next()` for an event loop: made on the client's runtime, `done(ok, value)` called on one
    /// of its threads with the `Route` or the exception; `Pending.cancel()` stops it.
    fn next_soon(&self, done: Py<PyAny>) -> PyResult<Pending> {
        let runtime = self.runtime()?;
        let mut routing = self.one_at_a_time()?;
        let task = runtime.spawn(async move {
            let next = routing.next().await.map(|route| {
                let params = routing.stamp_params(&route);
                (route, params)
            });
            drop(routing);
            Python::attach(|py| {
                let made = match next {
                    Ok((route, params)) => {
                        route_of(py, route, params).and_then(|r| Ok(Py::new(py, r)?.into_any()))
                    }
                    Err(e) => Err(errors::to_py(e)),
                };
                settle(py, &done, made);
            });
        });
        Ok(Pending(task.abort_handle()))
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
        let Some((rejection, routable)) = Self::refusal(sqlstate, detail, &can_route_to)? else {
            return Ok(false);
        };
        let runtime = self.runtime()?;
        let mut routing = self.one_at_a_time()?;
        let refused = routing.refused(&route.inner, &rejection, |_| routable);
        let verdict = wait(py, &runtime, refused)?.map_err(errors::to_py)?;
        Ok(verdict == Verdict::Retry)
    }

    /// `refused()` for an event loop, as `next_soon`: `done(ok, value)` with the bool or the
    /// exception.
    fn refused_soon(
        &self,
        route: &Route,
        sqlstate: &str,
        detail: Option<&str>,
        can_route_to: Bound<'_, PyAny>,
        done: Py<PyAny>,
    ) -> PyResult<Pending> {
        let py = can_route_to.py();
        let refusal = Self::refusal(sqlstate, detail, &can_route_to)?;
        let runtime = self.runtime()?;
        let mut routing = self.one_at_a_time()?;
        let Some((rejection, routable)) = refusal else {
            settle(
                py,
                &done,
                Ok(false.into_pyobject(py)?.to_owned().into_any().unbind()),
            );
            return Ok(Pending(runtime.spawn(async {}).abort_handle()));
        };
        let at = route.inner;
        let task = runtime.spawn(async move {
            let verdict = routing.refused(&at, &rejection, |_| routable).await;
            drop(routing);
            Python::attach(|py| {
                let made = match verdict {
                    Ok(v) => Ok((v == Verdict::Retry)
                        .into_pyobject(py)
                        .map(|b| b.to_owned().into_any().unbind())
                        .unwrap_or_else(|never| match never {})),
                    Err(e) => Err(errors::to_py(e)),
                };
                settle(py, &done, made);
            });
        });
        Ok(Pending(task.abort_handle()))
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
