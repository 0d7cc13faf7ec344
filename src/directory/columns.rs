//! The type of each column of the directory's tables, as the triggers and the bookkeeping writes
//! (`heap`) read and write them raw, with no SQL to convert: a text datum read from a column a
//! DBA altered to integer is a pointer followed (the server crashes), a bigint written to a
//! numeric column a pointer stored. Every column is checked where it is found, before its first
//! read or write, against the one type its name has in all of these tables.

use std::ffi::CStr;

use pgrx::prelude::*;

use crate::catalog;
use crate::error::SdError;

/// The type a column named `name` has in the directory's tables.
fn expected(name: &CStr) -> (pg_sys::Oid, &'static str) {
    match name.to_bytes() {
        b"version" | b"txid" | b"history_id" | b"move_id" => (pg_sys::INT8OID, "bigint"),
        b"updated_at" | b"changed_at" | b"version_at" | b"created_at" | b"finished_at" => {
            (pg_sys::TIMESTAMPTZOID, "timestamp with time zone")
        }
        _ => (pg_sys::TEXTOID, "text"),
    }
}

/// Refuses (42804, naming the column and its table) column `attr` of a table that `desc`
/// describes when it is not of the type the extension takes it as.
pub fn check(desc: pg_sys::TupleDesc, attr: &pg_sys::FormData_pg_attribute) {
    let name = unsafe { CStr::from_ptr(attr.attname.data.as_ptr()) };
    let (oid, expected) = expected(name);
    if attr.atttypid == oid {
        return;
    }
    // Only on the way to the error: which table, and what the column is now.
    let (table, found) = unsafe {
        let relid = pg_sys::get_typ_typrelid((*desc).tdtypeid);
        let found = CStr::from_ptr(pg_sys::format_type_with_typemod(
            attr.atttypid,
            attr.atttypmod,
        ));
        (
            catalog::relation_name(relid),
            found.to_string_lossy().into_owned(),
        )
    };
    SdError::ColumnType {
        table,
        column: name.to_string_lossy().into_owned(),
        expected,
        found,
    }
    .raise()
}
