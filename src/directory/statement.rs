//! One version bump per statement that changes the directory.
//!
//! A BEFORE STATEMENT trigger opens a frame. Rows are stamped (BEFORE ROW) with the version the
//! statement expects to get, one past the newest bump (`latest`, or the version row when the
//! library is not preloaded), without waiting for anyone. The statement takes the lock that
//! orders versions only when its first written row is recorded (AFTER ROW, at the end of the
//! statement), bumps `shard_directory_version` under it and holds it until commit: versions
//! follow commit order, while the statement's own work (finding and writing its rows) runs
//! alongside other writers. A row whose stamp turned out wrong (another writer committed first,
//! or an expected one rolled back) is stamped again with the version the statement got. The
//! AFTER STATEMENT trigger closes the frame and notifies. A statement runs several statement
//! trigger pairs when it is a WITH query or an `INSERT ... ON CONFLICT DO UPDATE`: they share one
//! frame, so one statement gets one version and one notification. A statement that writes no row
//! (all skipped by `ON CONFLICT DO NOTHING`, or left as they were) bumps nothing.

use std::cell::RefCell;

use pgrx::prelude::*;

use super::writer::{self, Writer};
use super::{heap, latest};
use crate::error::{spi, SdError};
use crate::privilege;

/// The version a statement bumped to, and when: the time is taken while the version row is
/// locked and never goes below the previous bump's, so it follows version (and commit) order.
#[derive(Clone, Copy)]
pub struct Bump {
    pub version: i64,
    pub at: TimestampWithTimeZone,
}

struct Frame {
    /// Transaction nesting level at which the statement began: the frame is dropped when the
    /// subtransaction of that level is rolled back.
    nest_level: i32,
    /// Statement triggers begun and not yet ended.
    open: u32,
    /// The version rows were stamped with before the statement had its bump.
    predicted: Option<i64>,
    bump: Option<Bump>,
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

fn nest_level() -> i32 {
    unsafe { pg_sys::GetCurrentTransactionNestLevel() }
}

/// The frame of the statement running now, handed to `f`.
fn with_top<R>(f: impl FnOnce(Option<&mut Frame>) -> R) -> R {
    FRAMES.with_borrow_mut(|frames| f(frames.last_mut()))
}

/// The row and statement triggers a statement of the directory needs, by name: a change its
/// row triggers did not see would be stamped but never versioned, recorded or notified.
const NEEDED: [&std::ffi::CStr; 3] = [
    c"shard_directory_guard",
    c"shard_directory_history",
    c"shard_directory_changed",
];

/// Refuses a statement on `relation` when one of [`NEEDED`] would not fire in this session (it
/// is dropped, disabled, or enabled for the other `session_replication_role`).
fn require_triggers(relation: pg_sys::Relation) {
    let replica = unsafe { pg_sys::SessionReplicationRole }
        == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32;
    // SAFETY: the trigger descriptor lives as long as the open relation (the trigger's).
    let triggers = unsafe {
        let desc = (*relation).trigdesc;
        if desc.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts((*desc).triggers, (*desc).numtriggers as usize)
        }
    };
    let fires_now = if replica {
        pg_sys::TRIGGER_FIRES_ON_REPLICA
    } else {
        pg_sys::TRIGGER_FIRES_ON_ORIGIN
    };
    for needed in NEEDED {
        let fires = triggers.iter().any(|t| {
            let name = unsafe { std::ffi::CStr::from_ptr(t.tgname) };
            let enabled = t.tgenabled as u8;
            name == needed && (enabled == pg_sys::TRIGGER_FIRES_ALWAYS || enabled == fires_now)
        });
        if !fires {
            SdError::TriggersMissing {
                trigger: needed.to_str().unwrap_or_default(),
            }
            .raise();
        }
    }
}

/// Opens (or joins) the frame of the statement now starting on `relation`.
pub fn begin(relation: pg_sys::Relation) {
    let level = nest_level();
    let joined = with_top(|top| match top {
        Some(top) if top.nest_level == level && top.open > 0 => {
            top.open += 1;
            true
        }
        _ => false,
    });
    if !joined {
        require_triggers(relation);
        FRAMES.with_borrow_mut(|frames| {
            frames.push(Frame {
                nest_level: level,
                open: 1,
                predicted: None,
                bump: None,
            })
        });
    }
}

/// The top frame's `field`, made by `make` the first time (outside the frames' borrow: making it
/// reads and writes tables).
fn memo<T: Copy>(field: fn(&mut Frame) -> &mut Option<T>, make: impl FnOnce() -> T) -> T {
    match with_top(|top| top.map(|f| *field(f))) {
        None => SdError::TriggersMissing {
            trigger: "shard_directory_statement_begin",
        }
        .raise(),
        Some(Some(value)) => value,
        Some(None) => {
            let value = make();
            with_top(|top| {
                if let Some(top) = top {
                    *field(top) = Some(value);
                }
            });
            value
        }
    }
}

/// The version to stamp a row of the running statement with (BEFORE ROW): its bump once made,
/// else the version it expects. Takes no lock.
pub fn stamp() -> i64 {
    match with_top(|top| top.and_then(|f| f.bump)) {
        Some(bump) => bump.version,
        None => memo(|f| &mut f.predicted, predict),
    }
}

/// Whether `version` is one the running statement stamps its rows with (a row inserted with
/// any other version was not stamped by it: a restore).
pub fn stamped_with(version: i64) -> bool {
    with_top(|top| {
        top.is_some_and(|f| {
            f.predicted == Some(version) || f.bump.is_some_and(|b| b.version == version)
        })
    })
}

/// The version of the statement now running (AFTER ROW); the first call bumps the global version.
pub fn current() -> Bump {
    memo(|f| &mut f.bump, bump)
}

/// Closes one statement trigger pair. When the statement's last pair ends, notifies the version
/// it bumped to, if it bumped.
pub fn end() {
    let closed = with_top(|top| {
        let top = top?;
        top.open = top.open.saturating_sub(1);
        (top.open == 0).then_some(top.bump)
    });
    let Some(bump) = closed else {
        return;
    };
    FRAMES.with_borrow_mut(|frames| frames.pop());
    if let Some(b) = bump {
        notify(b.version);
    }
}

/// The version table's OID.
fn version_table() -> pg_sys::Oid {
    crate::catalog::relation(c"shard_directory_version")
}

/// The lock that orders versions: every writer of the version row takes it before reading the
/// row and holds it until its transaction ends, so versions follow commit order. A lock on the
/// version table as an object (`pg_locks.locktype = 'object'`), not on the table itself: readers
/// and autovacuum never wait for it. Returns the version table's OID.
pub fn lock_versions() -> pg_sys::Oid {
    let relid = version_table();
    unsafe {
        pg_sys::LockDatabaseObject(
            pg_sys::RelationRelationId,
            relid,
            0,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
        )
    };
    relid
}

/// The version the next bump will most likely make: one past the newest bump, committed or not
/// (a writer that has bumped commits before this statement gets the lock). Wrong when another
/// writer bumps in between, or one rolls back: the rows are then stamped again.
fn predict() -> i64 {
    if let Some(latest) = latest::get() {
        return latest + 1;
    }
    // Not preloaded: the newest version row, and whether a writer is changing it.
    let table = "shard_directory_version";
    let (version, pending) = heap::peek_singleton(version_table(), table, c"version");
    let Some(version) = version.and_then(|d| unsafe { i64::from_datum(d, false) }) else {
        SdError::SingletonMissing { table }.raise()
    };
    version + 1 + i64::from(pending)
}

fn bump() -> Bump {
    let relid = lock_versions();
    let hint = latest::row();
    let (bump, row) = heap::update_singleton(relid, "shard_directory_version", hint, |read| {
        let get = |name| unsafe { read(name).and_then(|d| i64::from_datum(d, false)) };
        let (Some(version), Some(at)) = (get(c"version"), get(c"updated_at")) else {
            SdError::SingletonMissing {
                table: "shard_directory_version",
            }
            .raise()
        };
        // Never before the previous bump's time: version_at follows version order.
        let at = at.max(unsafe { pg_sys::GetCurrentTimestamp() });
        let bump = Bump {
            version: version + 1,
            at: spi("version time", TimestampWithTimeZone::try_from(at)),
        };
        let columns = vec![
            (c"version", bump.version.into_datum()),
            (c"updated_at", bump.at.into_datum()),
        ];
        (columns, bump)
    });
    latest::set(bump.version);
    latest::set_row(row);
    bump
}

/// Raises the version to at least `version` (a restore); never lowers it. `at`, the restored
/// version row's time, is taken as it was dumped.
pub fn raise_to(version: i64, at: Option<TimestampWithTimeZone>) {
    let relid = lock_versions();
    privilege::as_owner_of(relid, || {
        writer::as_writer(Writer::Restore, || {
            spi(
                "raise the version to a restored one",
                Spi::run_with_args(
                    "UPDATE shard_directory.shard_directory_version \
                     SET version = $1, updated_at = coalesce($2, greatest(clock_timestamp(), updated_at)) \
                     WHERE version < $1 OR (version = $1 AND $2 IS NOT NULL)",
                    &[version.into(), at.into()],
                ),
            )
        })
    });
}

unsafe extern "C-unwind" {
    /// PostgreSQL's own `NOTIFY` (what `pg_notify()` calls); pgrx has no binding for it.
    fn Async_Notify(channel: *const std::ffi::c_char, payload: *const std::ffi::c_char);
}

/// Queues the notification, delivered at commit only. Called directly, not through SQL, which
/// would cost an executor run per changing statement.
pub fn notify(version: i64) {
    let payload = std::ffi::CString::new(version.to_string()).expect("digits have no NUL");
    // SAFETY: both strings live across the call; an ERROR (none is expected for this channel
    // and payload) is turned into a Rust panic by the guard.
    unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            Async_Notify(c"shard_directory".as_ptr(), payload.as_ptr())
        })
    }
}

/// Called by `crate::xact` while a subtransaction is rolled back: the frames it opened (at its
/// level, or deeper) end with it, bump and all.
pub fn abort_subtransaction() {
    let level = nest_level();
    FRAMES.with_borrow_mut(|frames| frames.retain(|f| f.nest_level < level));
}

/// Called by `crate::xact` when the transaction ends: no frame outlives its transaction.
pub fn clear() {
    FRAMES.with_borrow_mut(Vec::clear);
}
