//! `shard_directory`: directory-based sharding made safe.
//!
//! The same library plays two roles. On the **directory database** it keeps the entity -> shard
//! mapping honest: one version per changing statement, taken at commit and notified, append-only
//! history and a move state machine. On every **shard** it refuses work routed with an outdated
//! view of that mapping.
//!
//! - `directory`: the directory role (its own index);
//! - `shard`: the shard role (its own index);
//! - `entity`: the entity key both roles talk about (the protocol crate's), as SQL functions take
//!   it and the check borrows it;
//! - `error`: every error either side raises, with its SQLSTATE, DETAIL and HINT;
//! - `guc`: every setting the extension defines or reads;
//! - `catalog`: the extension's own objects, found by name; `privilege`: acting as the owner of
//!   the extension's tables, and who the current role is;
//! - `xact`: transaction callbacks (a transaction's versions taken at pre-commit; state that
//!   must not outlive its transaction or subtransaction);
//! - `pg_tests`: the in-database tests, by role.
//!
//! The SQL that declares the tables and wires the triggers is in `sql/`; the wire contract with
//! the client and the mover is the `shard-directory-protocol` crate.

// `SdError` names entities and placements by value so messages need no lookups; it is raised
// (ereport) where it is made, never carried through a loop, so its size costs nothing.
#![allow(clippy::result_large_err)]

use pgrx::prelude::*;

/// What every trigger function here returns: the row to write (BEFORE ROW), or nothing. Errors
/// are raised through `SdError::raise`, never returned, so the SQLSTATE is ours.
pub(crate) type TriggerResult<'a> =
    Result<Option<PgHeapTuple<'a, pgrx::AllocatedByRust>>, pgrx::datum::TryFromDatumError>;

mod catalog;
mod directory;
mod entity;
mod error;
mod guc;
mod privilege;
mod shard;
mod xact;

::pgrx::pg_module_magic!(name, version);

/// Runs once per backend when the library is loaded.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    guc::init();
    catalog::init();
    xact::init();
    directory::init();
    shard::init();
}

pgrx::extension_sql_file!(
    "../sql/directory.sql",
    name = "directory_objects",
    requires = [
        entity::require_utf8_database,
        directory::triggers::shard_directory_statement_begin,
        directory::triggers::shard_directory_guard,
        directory::triggers::shard_directory_record_history,
        directory::triggers::notify_directory_change,
        directory::triggers::shard_directory_history_guard,
        directory::triggers::shard_directory_version_guard,
        directory::triggers::shard_directory_refuse_truncate,
        directory::triggers::shards_guard,
        directory::triggers::shard_moves_notify,
        directory::replica::check_publications,
        directory::moves::current_version,
    ]
);

pgrx::extension_sql_file!(
    "../sql/shard.sql",
    name = "shard_objects",
    requires = [
        "directory_objects",
        shard::fences::shard_settings_guard,
        shard::fences::shard_fences_changed,
        shard::check::shard_directory_protect_statement,
        shard::check::shard_directory_protect_row,
    ]
);

pgrx::extension_sql_file!("../sql/privileges.sql", name = "privileges", finalize);

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'shard_directory'"]
    }
}
