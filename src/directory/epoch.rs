//! The directory's epoch: which history its versions belong to. A restore (from a cold copy, a
//! base backup, a dump), a failover to a standby that missed the last commits, or a second
//! standby promoted by mistake goes on from an older version and numbers again, with other
//! contents, versions that clients already knew: versions alone cannot tell the histories apart,
//! and neither can the timeline (a cold copy keeps it; two standbys promoted apart both take the
//! next one).
//!
//! So the version row carries a *lineage*: a random id that the first change made by a server
//! other than the one that minted it replaces. Every server start is another server here (a
//! restart, a promotion's standby, a restored copy): its first change mints a lineage of its own,
//! so two copies of the directory that go on apart differ from their first new version on, and
//! `(epoch, version)` names one state of the directory. Until that change a copy is the state
//! it was copied at, which is the history it shares. A restart followed by a change costs
//! clients one flush; docs/directory.md says why that was chosen over a digest chain.

use std::ffi::CStr;

use pgrx::prelude::*;

use super::{heap, latest};
use crate::catalog;
use crate::error::SdError;

/// The version row's columns that hold the lineage and the server start that minted it.
const LINEAGE: &CStr = c"lineage";
const MINTED_BY: &CStr = c"lineage_minted_by";

/// `<system identifier>.<lineage>`: the same on a streaming replica as on its primary, another
/// value once a copy that went on apart (a restore, a promotion) has changed the directory.
/// Before the first change since the lineage existed (an extension just made or updated):
/// `<system identifier>.<timeline>`. Anyone may read it, as the version: clients read it with
/// every version they read.
#[pg_extern(stable, parallel_safe)]
fn directory_epoch() -> String {
    // SAFETY: reads shared memory the server set up at start; raises no error.
    let version = catalog::relation(c"shard_directory_version");
    match heap::read_singleton_text(version, "shard_directory_version", LINEAGE, latest::row()) {
        Some(lineage) if !lineage.is_empty() => of_lineage(&lineage),
        // SAFETY: reads shared memory the server set up at start; raises no error.
        _ => format!(
            "{}.{}",
            unsafe { pg_sys::GetSystemIdentifier() },
            timeline()
        ),
    }
}

/// The epoch of `lineage`, as `directory_epoch()` says it.
fn of_lineage(lineage: &str) -> String {
    // SAFETY: reads shared memory the server set up at start; raises no error.
    let system = unsafe { pg_sys::GetSystemIdentifier() };
    format!("{system}.{lineage}")
}

/// The timeline this server writes (or, in recovery, replays).
fn timeline() -> u32 {
    // SAFETY: read shared memory the server set up at start; neither raises an error.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            let mut replaying = 0;
            pg_sys::GetXLogReplayRecPtr(&mut replaying);
            replaying
        } else {
            pg_sys::GetWALInsertionTimeLine()
        }
    }
}

/// This copy of the directory: the cluster's system identifier, when its postmaster started, and
/// the database. A restart, a standby (promoted or not), a copy started elsewhere and a copy
/// made beside it (`CREATE DATABASE ... TEMPLATE`, then perhaps renamed in its place) each are
/// another. A crash of one backend, which the postmaster survives, is not: no version it made
/// visible is lost, since each is flushed before it is visible ([`durable`]).
fn this_server() -> String {
    // SAFETY: read values the postmaster and this backend set at start.
    let (system, started, database) = unsafe {
        (
            pg_sys::GetSystemIdentifier(),
            pg_sys::PgStartTime,
            pg_sys::MyDatabaseId,
        )
    };
    format!("{system}.{started}.{}", database.to_u32())
}

/// Makes this transaction's commit flush its WAL before it is visible, whatever
/// `synchronous_commit` says: a version a client has read is never lost in a crash (with it off,
/// a crash of one backend, which restarts nothing, could lose a commit readers had seen, and
/// the next change would number its version again in the same lineage). Called by every bump.
pub fn durable() {
    // SAFETY: sets a flag of the running transaction, read at its commit.
    unsafe { pg_sys::ForceSyncCommit() }
}

/// A lineage a bump minted: the version row's columns that hold it, and the epoch it begins.
pub struct Minted {
    pub columns: [heap::Column<'static>; 2],
    pub epoch: String,
}

/// The lineage a bump mints into the version row, whose lineage columns `read` reads: none while
/// this server minted the lineage; else a new one, minted by this server. None either on a
/// version row without them (the library newer than the extension's objects, until `ALTER
/// EXTENSION shard_directory UPDATE`).
pub fn on_bump(read: &dyn Fn(&CStr) -> Option<String>, has: bool) -> Option<Minted> {
    let server = this_server();
    if !has || read(MINTED_BY).as_deref() == Some(server.as_str()) {
        return None;
    }
    let lineage = mint();
    Some(Minted {
        epoch: of_lineage(&lineage),
        columns: [
            (LINEAGE, lineage.into_datum()),
            (MINTED_BY, server.into_datum()),
        ],
    })
}

/// Whether the version row of this extension has the lineage columns.
pub fn columns_present(relid: pg_sys::Oid) -> bool {
    heap::has_column(relid, LINEAGE) && heap::has_column(relid, MINTED_BY)
}

/// 64 random bits, as 16 hex digits.
fn mint() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: writes `bytes.len()` bytes into the buffer.
    let ok = unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) };
    if !ok {
        SdError::Spi {
            during: "mint the directory's lineage",
            cause: "pg_strong_random() failed".into(),
            datatype: false,
        }
        .raise()
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
