//! The extension's own objects, found by name in its schema.

use std::ffi::CStr;

use pgrx::pg_sys;

use crate::error::SdError;

/// The OID of `shard_directory.<name>`; an error naming it when it is missing.
pub fn relation(name: &CStr) -> pg_sys::Oid {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"shard_directory".as_ptr(), true);
        let oid = if ns == pg_sys::InvalidOid {
            pg_sys::InvalidOid
        } else {
            pg_sys::get_relname_relid(name.as_ptr(), ns)
        };
        if oid == pg_sys::InvalidOid {
            SdError::ObjectMissing {
                name: name.to_string_lossy().into_owned(),
            }
            .raise();
        }
        oid
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
