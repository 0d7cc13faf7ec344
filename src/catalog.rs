//! The extension's own objects, found by name in its schema.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::pg_sys;

use crate::error::SdError;

thread_local! {
    /// OIDs found by [`relation`] and [`function`]: every directory change names its tables
    /// several times, and two catalog lookups by name each time were 1.4% of a one-entry change
    /// under `perf`; every protected INSERT asks for the trigger functions.
    static FOUND: RefCell<Vec<(Kind, &'static CStr, pg_sys::Oid)>> = const { RefCell::new(Vec::new()) };
    /// Set by the callback (which may run while `FOUND` is borrowed): forget every OID.
    static FORGET: Cell<bool> = const { Cell::new(false) };
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Relation,
    Function,
}

/// Any change to a relation's, a function's or a schema's name entry (a table made, dropped,
/// renamed or moved; the extension dropped and made anew) empties the cache, as PostgreSQL's own
/// caches are kept.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    FORGET.set(true);
}

pub fn init() {
    for cache in [
        pg_sys::SysCacheIdentifier::RELNAMENSP,
        pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP,
        pg_sys::SysCacheIdentifier::NAMESPACENAME,
    ] {
        unsafe {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as i32,
                Some(forget),
                pg_sys::Datum::from(0),
            )
        };
    }
}

/// The OID of `shard_directory.<name>`; an error naming it when it is missing.
pub fn relation(name: &'static CStr) -> pg_sys::Oid {
    try_relation(name).unwrap_or_else(|| {
        SdError::ObjectMissing {
            name: name.to_string_lossy().into_owned(),
        }
        .raise()
    })
}

/// The OID of `shard_directory.<name>`, if it exists.
pub fn try_relation(name: &'static CStr) -> Option<pg_sys::Oid> {
    found(Kind::Relation, name)
}

/// The OID of the function `shard_directory.<name>()` (no arguments), if it exists.
pub fn function(name: &'static CStr) -> Option<pg_sys::Oid> {
    found(Kind::Function, name)
}

fn found(kind: Kind, name: &'static CStr) -> Option<pg_sys::Oid> {
    // As fresh as the catalog lookups it saves: both see invalidations once they are processed.
    if FORGET.replace(false) {
        FOUND.with_borrow_mut(Vec::clear);
    }
    let cached = FOUND.with_borrow(|f| {
        f.iter()
            .find(|(k, n, _)| *k == kind && *n == name)
            .map(|f| f.2)
    });
    if let Some(oid) = cached {
        return Some(oid);
    }
    let oid = lookup(kind, name)?;
    FOUND.with_borrow_mut(|f| f.push((kind, name, oid)));
    Some(oid)
}

fn lookup(kind: Kind, name: &CStr) -> Option<pg_sys::Oid> {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"shard_directory".as_ptr(), true);
        let oid = if ns == pg_sys::InvalidOid {
            pg_sys::InvalidOid
        } else {
            match kind {
                Kind::Relation => pg_sys::get_relname_relid(name.as_ptr(), ns),
                Kind::Function => pg_sys::GetSysCacheOid(
                    pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP as i32,
                    pg_sys::Anum_pg_proc_oid as pg_sys::AttrNumber,
                    pg_sys::Datum::from(name.as_ptr()),
                    pg_sys::Datum::from(pg_sys::buildoidvector(std::ptr::null(), 0)),
                    pg_sys::Datum::from(ns),
                    pg_sys::Datum::from(0),
                ),
            }
        };
        (oid != pg_sys::InvalidOid).then_some(oid)
    }
}

/// Refuses to run a trigger function of the extension on any table but `table`: its EXECUTE
/// privilege is not PUBLIC, and this holds even for a role it was granted to.
pub fn require_own_table(relation: pg_sys::Relation, function: &'static str, table: &'static CStr) {
    let relid = unsafe { (*relation).rd_id };
    if relid != self::relation(table) {
        SdError::TriggerMisused {
            function,
            table: relation_name(relid),
        }
        .raise();
    }
}

/// `schema.table` as `regclass` prints it.
pub fn relation_name(relid: pg_sys::Oid) -> String {
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        if name.is_null() {
            return relid.to_u32().to_string();
        }
        let ns = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        let quote = |s: *const std::ffi::c_char| {
            CStr::from_ptr(pg_sys::quote_identifier(s))
                .to_string_lossy()
                .into_owned()
        };
        if ns.is_null() {
            quote(name)
        } else {
            format!("{}.{}", quote(ns), quote(name))
        }
    }
}

/// The `len` items PostgreSQL keeps at `ptr`: empty when there are none, whatever the pointer
/// (PostgreSQL leaves it NULL then: a table without indexes, a descriptor without triggers), so
/// that no slice is ever made from NULL. Every array taken from PostgreSQL is read through this.
///
/// # Safety
/// When `len` is positive and `ptr` is not NULL, `ptr` points to `len` initialized items that
/// outlive `'a`.
pub unsafe fn slice<'a, T>(ptr: *const T, len: impl TryInto<usize>) -> &'a [T] {
    match len.try_into() {
        Ok(len) if len > 0 && !ptr.is_null() => unsafe { std::slice::from_raw_parts(ptr, len) },
        _ => &[],
    }
}

/// [`slice`], to change the items in place.
///
/// # Safety
/// As [`slice`], and nothing else reads or writes the items while the slice lives.
pub unsafe fn slice_mut<'a, T>(ptr: *mut T, len: impl TryInto<usize>) -> &'a mut [T] {
    match len.try_into() {
        Ok(len) if len > 0 && !ptr.is_null() => unsafe { std::slice::from_raw_parts_mut(ptr, len) },
        _ => &mut [],
    }
}

/// The cells of a PostgreSQL `List`; none for `NIL` (NULL).
///
/// # Safety
/// `list` is NULL or a valid list that outlives `'a`.
pub unsafe fn list_cells<'a>(list: *const pg_sys::List) -> &'a [pg_sys::ListCell] {
    if list.is_null() {
        return &[];
    }
    unsafe { slice((*list).elements, (*list).length) }
}

/// The columns `desc` describes, dropped ones included (18 keeps them after its compact form of
/// each, where its `TupleDescAttr` finds them).
///
/// # Safety
/// `desc` is a valid descriptor that outlives the slice.
pub unsafe fn attributes<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    unsafe {
        let natts = (*desc).natts as usize;
        #[cfg(not(feature = "pg18"))]
        let attrs = (*desc).attrs.as_slice(natts);
        #[cfg(feature = "pg18")]
        let attrs = slice(
            (*desc).compact_attrs.as_ptr().add(natts) as *const pg_sys::FormData_pg_attribute,
            natts,
        );
        attrs
    }
}

/// The table's primary key index (`InvalidOid` when it has none, or a deferrable one).
///
/// # Safety
/// `relation` is open.
pub unsafe fn primary_key_index(relation: pg_sys::Relation) -> pg_sys::Oid {
    #[cfg(not(feature = "pg18"))]
    let index = unsafe { pg_sys::RelationGetPrimaryKeyIndex(relation) };
    // 18 may also return a deferrable one, when asked to.
    #[cfg(feature = "pg18")]
    let index = unsafe { pg_sys::RelationGetPrimaryKeyIndex(relation, false) };
    index
}
