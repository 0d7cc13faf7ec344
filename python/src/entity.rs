//! An entity's type and id as the directory keys them, from what Python passes: the type a
//! `str`, the id a `str` or an `int` (`8842` is `"8842"`, a `bool` is neither), and neither
//! holding NUL. Checked here once, in the call that uses them, so that a cached lookup pays no
//! Python-level check.

use std::borrow::Cow;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

/// `entity_type` and `entity_id` as the directory's text, or `TypeError` / `ValueError`.
pub fn key<'a>(
    entity_type: &'a Bound<'_, PyAny>,
    entity_id: &'a Bound<'_, PyAny>,
) -> PyResult<(Cow<'a, str>, Cow<'a, str>)> {
    let entity_type = match entity_type.cast::<PyString>() {
        Ok(s) => s.to_cow()?,
        Err(_) => return Err(wrong("entity_type must be a str", entity_type)),
    };
    let entity_id = if let Ok(s) = entity_id.cast::<PyString>() {
        s.to_cow()?
    } else if entity_id.is_instance_of::<PyInt>() && !entity_id.is_instance_of::<PyBool>() {
        // Its number, not its str(): an IntEnum's str() is its member's name.
        let number = entity_id.call_method0("__index__")?;
        Cow::Owned(number.str()?.to_cow()?.into_owned())
    } else {
        return Err(wrong("entity_id must be a str or an int", entity_id));
    };
    if entity_type.contains('\0') || entity_id.contains('\0') {
        return Err(PyValueError::new_err(
            "an entity's type and id cannot contain NUL",
        ));
    }
    Ok((entity_type, entity_id))
}

fn wrong(what: &str, value: &Bound<'_, PyAny>) -> PyErr {
    let name = value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string());
    PyTypeError::new_err(format!("{what}, not {name}"))
}

/// An entity's type and id as the directory keys them (see the module); what the routers
/// name the entity by in their errors.
#[pyfunction]
pub fn entity(
    entity_type: &Bound<'_, PyAny>,
    entity_id: &Bound<'_, PyAny>,
) -> PyResult<(String, String)> {
    let (t, i) = key(entity_type, entity_id)?;
    Ok((t.into_owned(), i.into_owned()))
}
