//! One version bump per statement that changes the directory.
//!
//! A BEFORE STATEMENT trigger opens a frame; the first row the statement changes bumps
//! `shard_directory_version` (under `lock_versions`, held until commit, so versions follow
//! commit order) and every row of the statement is stamped with that value; the
//! AFTER STATEMENT trigger closes the frame and notifies. A statement runs several statement
//! trigger pairs when it is a WITH query or an `INSERT ... ON CONFLICT DO UPDATE`: they share one
//! frame, so one statement gets one version and one notification. A statement whose rows were
//! all skipped (`ON CONFLICT DO NOTHING`) takes its bump back: it changed nothing.

use std::cell::RefCell;

use pgrx::prelude::*;

use super::heap;
use super::writer::{self, Writer};
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
    /// Transaction nesting level at which the statement began: a frame above the current level
    /// belongs to a statement whose subtransaction was rolled back.
    nest_level: i32,
    /// Statement triggers begun and not yet ended.
    open: u32,
    bump: Option<Bump>,
    /// Whether a row of the statement was written (an AFTER ROW trigger ran for it).
    written: bool,
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

fn nest_level() -> i32 {
    unsafe { pg_sys::GetCurrentTransactionNestLevel() }
}

/// The frames still alive at the current nesting level, with the top one handed to `f`.
fn with_top<R>(f: impl FnOnce(Option<&mut Frame>) -> R) -> R {
    FRAMES.with_borrow_mut(|frames| {
        let level = nest_level();
        while frames.last().is_some_and(|f| f.nest_level > level) {
            frames.pop();
        }
        f(frames.last_mut())
    })
}

pub fn begin() {
    let level = nest_level();
    let joined = with_top(|top| match top {
        Some(top) if top.nest_level == level && top.open > 0 => {
            top.open += 1;
            true
        }
        _ => false,
    });
    if !joined {
        FRAMES.with_borrow_mut(|frames| {
            frames.push(Frame {
                nest_level: level,
                open: 1,
                bump: None,
                written: false,
            })
        });
    }
}

/// The version of the statement now running; the first call bumps the global version.
pub fn current() -> Bump {
    match with_top(|top| top.map(|f| f.bump)) {
        None => SdError::TriggersMissing.raise(),
        Some(Some(b)) => b,
        Some(None) => {
            let b = bump();
            with_top(|top| {
                if let Some(top) = top {
                    top.bump = Some(b);
                }
            });
            b
        }
    }
}

/// The statement's bump, if it made one.
pub fn peek() -> Option<Bump> {
    with_top(|top| top.and_then(|f| f.bump))
}

/// An AFTER ROW trigger saw one of the statement's rows written.
pub fn written() {
    with_top(|top| {
        if let Some(top) = top {
            top.written = true;
        }
    });
}

/// Closes one statement trigger pair. When the statement's last pair ends, notifies the version
/// it bumped to, or takes the bump back if no row was written.
pub fn end() {
    let closed = with_top(|top| {
        let top = top?;
        top.open = top.open.saturating_sub(1);
        (top.open == 0).then_some((top.bump, top.written))
    });
    let Some((bump, written)) = closed else {
        return;
    };
    FRAMES.with_borrow_mut(|frames| frames.pop());
    match bump {
        Some(b) if written => notify(b.version),
        Some(b) => unbump(b.version),
        None => {}
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

fn bump() -> Bump {
    let relid = lock_versions();
    heap::update_singleton(relid, "shard_directory_version", |read| {
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
    })
}

/// Takes back `version` if it is still the latest (a deeper statement may have bumped past it;
/// then the gap stays, which clients read as a change that was not one).
fn unbump(version: i64) {
    let relid = lock_versions();
    privilege::as_owner_of(relid, || {
        writer::as_writer(Writer::Unbump, || {
            spi(
                "take back an unused version",
                Spi::run_with_args(
                    "UPDATE shard_directory.shard_directory_version SET version = version - 1 \
                     WHERE version = $1",
                    &[version.into()],
                ),
            )
        })
    });
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

/// Called by `crate::xact` when the transaction ends: no frame outlives its transaction.
pub fn clear() {
    FRAMES.with_borrow_mut(Vec::clear);
}
