//! `shard_directory._native`: the Rust client under the Python package `shard-directory`
//! (`python/python/shard_directory`, which is what applications import).
//!
//! - `directory`: `Directory` (cache, watcher, relay, replicas, shared cache, epoch) and
//!   `Entry`;
//! - `routing`: `Routing` and `Route`, the decisions of a routed transaction whose connections
//!   are psycopg's, and the stamp;
//! - `entity`: an entity's type and id from what Python passes, checked once;
//! - `errors`: the exception classes;
//! - `wait`: the client's futures run with the GIL released, interruptible by signals.

use pyo3::prelude::*;

mod directory;
mod entity;
mod errors;
mod routing;
mod wait;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<directory::Directory>()?;
    m.add_class::<directory::Entry>()?;
    m.add_class::<routing::Routing>()?;
    m.add_class::<routing::Route>()?;
    m.add_class::<routing::Pending>()?;
    m.add_function(wrap_pyfunction!(entity::entity, m)?)?;
    m.add_function(wrap_pyfunction!(routing::stamp_sql, m)?)?;
    m.add_function(wrap_pyfunction!(routing::refusal_reason, m)?)?;
    errors::register(m)?;
    Ok(())
}
