//! The package's exceptions, one class per error of the Rust client (and the ones the Python
//! router raises itself: `Rejected`, `ShardUnavailable`, `Aborted`), each with `retryable` and what it names (the entity, the shard), in one
//! place. `shard_directory/__init__.py` re-exports them.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use shard_directory_client::{EntityKey, Error};

pyo3::create_exception!(
    shard_directory,
    ShardDirectoryError,
    PyException,
    "Any error of shard_directory's; `retryable` says whether the same work can succeed later."
);
pyo3::create_exception!(
    shard_directory,
    DirectoryUnavailable,
    ShardDirectoryError,
    "The directory could not be reached, or did not answer in time (the outage policy's case)."
);
pyo3::create_exception!(
    shard_directory,
    DirectoryError,
    ShardDirectoryError,
    "The directory answered a query with an error."
);
pyo3::create_exception!(
    shard_directory,
    UnknownEntity,
    ShardDirectoryError,
    "The directory has no entry for the entity."
);
pyo3::create_exception!(
    shard_directory,
    UnknownShard,
    ShardDirectoryError,
    "The entry names a shard the router has no connection settings for."
);
pyo3::create_exception!(
    shard_directory,
    ReadOnly,
    ShardDirectoryError,
    "A write to an entity whose cutover still ran at the deadline (retryable)."
);
pyo3::create_exception!(
    shard_directory,
    FailClosed,
    ShardDirectoryError,
    "The directory is unreachable and the entity cannot be served from the cache (mid-move)."
);
pyo3::create_exception!(
    shard_directory,
    Rejected,
    ShardDirectoryError,
    "Shards kept refusing the transaction (40001) until the deadline: `reason`, `attempts`."
);
pyo3::create_exception!(
    shard_directory,
    DirectoryBehind,
    ShardDirectoryError,
    "A shard requires a directory version the directory has not reached."
);
pyo3::create_exception!(
    shard_directory,
    ShardUnavailable,
    ShardDirectoryError,
    "A shard could not be reached within the attempt's time."
);
pyo3::create_exception!(
    shard_directory,
    Aborted,
    ShardDirectoryError,
    "The transaction was aborted by an error the application caught: rolled back, not committed."
);
pyo3::create_exception!(
    shard_directory,
    ConfigError,
    ShardDirectoryError,
    "A setting the client cannot use."
);

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ShardDirectoryError", py.get_type::<ShardDirectoryError>())?;
    m.add(
        "DirectoryUnavailable",
        py.get_type::<DirectoryUnavailable>(),
    )?;
    m.add("DirectoryError", py.get_type::<DirectoryError>())?;
    m.add("UnknownEntity", py.get_type::<UnknownEntity>())?;
    m.add("UnknownShard", py.get_type::<UnknownShard>())?;
    m.add("ReadOnly", py.get_type::<ReadOnly>())?;
    m.add("FailClosed", py.get_type::<FailClosed>())?;
    m.add("Rejected", py.get_type::<Rejected>())?;
    m.add("DirectoryBehind", py.get_type::<DirectoryBehind>())?;
    m.add("ShardUnavailable", py.get_type::<ShardUnavailable>())?;
    m.add("Aborted", py.get_type::<Aborted>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    Ok(())
}

/// The Python exception of `e`, with `retryable` and the names it carries as attributes.
pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    let retryable = e.is_retryable();
    let mut attrs: Vec<(&str, PyObjectish)> = Vec::new();
    let entity = |k: &EntityKey| {
        [
            ("entity_type", PyObjectish::Text(k.entity_type.clone())),
            ("entity_id", PyObjectish::Text(k.entity_id.clone())),
        ]
    };
    let err = match &e {
        _ if e.is_directory_outage() => DirectoryUnavailable::new_err(message),
        Error::DirectoryBusy { .. } => DirectoryUnavailable::new_err(message),
        Error::Directory(_) => DirectoryError::new_err(message),
        Error::UnknownEntity(k) => {
            attrs.extend(entity(k));
            UnknownEntity::new_err(message)
        }
        Error::UnknownShard { entity: k, shard } => {
            attrs.extend(entity(k));
            attrs.push(("shard", PyObjectish::Text(shard.clone())));
            UnknownShard::new_err(message)
        }
        Error::ReadOnly(k) => {
            attrs.extend(entity(k));
            ReadOnly::new_err(message)
        }
        Error::FailClosed {
            entity: k, reason, ..
        } => {
            attrs.extend(entity(k));
            attrs.push(("reason", PyObjectish::Text((*reason).to_owned())));
            FailClosed::new_err(message)
        }
        Error::DirectoryBehind {
            entity: k,
            shard,
            minimum,
            directory_version,
        } => {
            attrs.extend(entity(k));
            attrs.push(("shard", PyObjectish::Text(shard.clone())));
            attrs.push(("minimum", PyObjectish::Int(*minimum)));
            attrs.push(("directory_version", PyObjectish::Int(*directory_version)));
            DirectoryBehind::new_err(message)
        }
        _ if e.is_shard_unreachable() => ShardUnavailable::new_err(message),
        Error::Config(_) => ConfigError::new_err(message),
        _ => ShardDirectoryError::new_err(message),
    };
    Python::attach(|py| {
        let value = err.value(py);
        let _ = value.setattr("retryable", retryable);
        for (name, v) in attrs {
            let _ = match v {
                PyObjectish::Text(t) => value.setattr(name, t),
                PyObjectish::Int(i) => value.setattr(name, i),
            };
        }
    });
    err
}

/// An attribute's value.
enum PyObjectish {
    Text(String),
    Int(i64),
}
