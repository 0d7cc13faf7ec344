//! `changes_since(since, max_changes)`: what changed after version `since`, the read every
//! router's watcher makes on every change. Written here rather than in PL/pgSQL: starting the
//! executor for its three queries, once per router per change, was a quarter of the directory's
//! CPU with 256 routers (`perf`, `bench_fanout`). The SQL declaration (its OUT parameters, and
//! what they mean) is in `sql/directory.sql`.

use std::collections::HashMap;

use pgrx::pg_sys;
use pgrx::prelude::*;

use super::{heap, latest};
use crate::catalog;
use crate::error::SdError;

/// The version-1 calling convention for [`changes_since_native`], as `#[pg_extern]` declares its
/// own functions' (it cannot declare one that returns a record of OUT parameters).
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_changes_since_native() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// The C entry point of `shard_directory.changes_since`.
///
/// # Safety
/// Called by PostgreSQL's function manager, with the call's `fcinfo`.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub unsafe extern "C-unwind" fn changes_since_native(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe { pg_sys::submodules::panic::pgrx_extern_c_guard(|| changes_since(fcinfo)) }
}

/// The entries changed in `(since, version]` and the latest version that changed each; `None`
/// when history does not hold every version of that range (purged, or a version bumped without
/// a change: a direct write to the version row), when more than `max_changes` history rows are
/// in it, or when a row cannot be read (its NOT NULL columns are never NULL): the caller then
/// forgets everything rather than miss a key. Every version is one statement's, with at least
/// one history row, and the scan runs in version order: the range is covered when each row's
/// version is its predecessor's or the next one, from `since + 1` to `version`.
fn changed(since: i64, version: i64, max_changes: i32) -> Option<HashMap<(String, String), i64>> {
    let mut rows = 0;
    let mut covered = since;
    let mut changed = Some(HashMap::new());
    heap::scan_bigint_range(
        catalog::relation(c"shard_directory_history"),
        catalog::relation(c"shard_directory_history_version_idx"),
        c"version",
        Some((since, version)),
        |get| {
            rows += 1;
            let text = |name| unsafe { get(name).and_then(|d| String::from_datum(d, false)) };
            let at = unsafe { get(c"version").and_then(|d| i64::from_datum(d, false)) };
            let (Some(map), Some(entity_type), Some(entity_id), Some(at), true) = (
                changed.as_mut(),
                text(c"entity_type"),
                text(c"entity_id"),
                at.filter(|at| *at == covered || *at == covered + 1),
                rows <= i64::from(max_changes),
            ) else {
                changed = None;
                return false;
            };
            covered = at;
            let latest = map.entry((entity_type, entity_id)).or_insert(at);
            *latest = (*latest).max(at);
            true
        },
    );
    changed.filter(|_| covered == version)
}

unsafe fn changes_since(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // STRICT: PostgreSQL never calls it with a NULL argument.
    let arg = |i: usize| unsafe { (*(*fcinfo).args.as_ptr().add(i)).value };
    let since = unsafe { i64::from_datum(arg(0), false) }.unwrap_or_default();
    let max_changes = unsafe { i32::from_datum(arg(1), false) }.unwrap_or_default();

    let table = "shard_directory_version";
    let [version, updated_at] = heap::read_singleton(
        catalog::relation(c"shard_directory_version"),
        table,
        latest::row(),
        [c"version", c"updated_at"],
    )
    .map(|d| d.and_then(|d| unsafe { i64::from_datum(d, false) }));
    let (Some(version), Some(updated_at)) = (version, updated_at) else {
        SdError::SingletonMissing { table }.raise()
    };
    // now(): the transaction's start.
    let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    let age = (now - updated_at) as f64 / 1e6;
    let (complete, changed) = if since >= version {
        (true, None)
    } else {
        match changed(since, version, max_changes) {
            Some(changed) => (true, Some(changed)),
            None => (false, None),
        }
    };
    let mut keys = (Vec::new(), Vec::new(), Vec::new());
    for ((entity_type, entity_id), at) in changed.into_iter().flatten() {
        keys.0.push(entity_type);
        keys.1.push(entity_id);
        keys.2.push(at);
    }
    // As array_agg over no rows: NULL.
    let (types, ids, versions) = if keys.0.is_empty() {
        (None, None, None)
    } else {
        (
            keys.0.into_datum(),
            keys.1.into_datum(),
            keys.2.into_datum(),
        )
    };
    let values = [
        version.into_datum(),
        age.into_datum(),
        complete.into_datum(),
        types,
        ids,
        versions,
    ];
    // SAFETY: the descriptor PostgreSQL gives for the call's OUT parameters, six columns in this
    // order and of these types (sql/directory.sql).
    unsafe {
        let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
        if pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc)
            != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE
            || (*desc).natts as usize != values.len()
        {
            SdError::ObjectMissing {
                name: "shard_directory.changes_since(bigint, integer) with its six OUT parameters"
                    .into(),
            }
            .raise();
        }
        let desc = pg_sys::BlessTupleDesc(desc);
        let mut nulls = values.map(|v| v.is_none());
        let mut datums = values.map(|v| v.unwrap_or(pg_sys::Datum::from(0)));
        let tuple = pg_sys::heap_form_tuple(desc, datums.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::HeapTupleHeaderGetDatum((*tuple).t_data)
    }
}
