//! One version per statement that changes the directory, taken when its transaction commits.
//!
//! A BEFORE STATEMENT trigger opens a frame. Rows are stamped (BEFORE ROW) with the version the
//! statement expects to get: one past the newest bump (`latest`, or the version row when the
//! library is not preloaded) and past what its transaction's earlier statements expect, without
//! waiting for anyone. What each changed row needs once the version is known waits in the frame
//! (AFTER ROW): where the row was written, and its history. At the transaction's pre-commit,
//! after the last row lock it takes, the transaction takes the lock that orders versions and
//! gives each of its statements the next version in the order they expected them: rows whose
//! stamp turned out wrong (another writer committed first, or one rolled back) are stamped
//! again, history is written, and each version is notified. The lock is held until commit, so
//! versions follow commit order; and since a writer asks for it only when it will wait for no
//! row, no two writers can each hold what the other waits for. (Taken at each statement's end,
//! it deadlocked two-statement transactions under contention: the first statement's lock was
//! held while the second waited for a row held by a writer waiting for the lock.)
//!
//! Some take the lock sooner ([`settle`]): a move step, which returns its version; and a
//! transaction whose waiting history passes [`WAITING_LIMIT`] changes, which would otherwise hold
//! it all in memory. From then on that transaction's changes are versioned as they are recorded,
//! and it holds the lock while it may still wait for rows: docs/directory.md says so.
//!
//! A statement runs several statement trigger pairs when it is a WITH query or an
//! `INSERT ... ON CONFLICT DO UPDATE`: they share one frame, so one statement gets one version and
//! one notification. A statement that writes no row bumps nothing. Frames follow
//! subtransactions: a rolled-back subtransaction takes its frames with it, and undoes any bump it
//! made for its parent's frames (the bump, the stamps and the history it wrote are rolled back
//! with it; they are made again at commit).

#![warn(clippy::undocumented_unsafe_blocks)]

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::prelude::*;
use shard_directory_protocol::{CHANNEL, EPOCH_CHANNEL};

use super::history::{self, Bump, Change};
use super::writer::{self, Writer};
use super::{epoch, heap, latest};
use crate::catalog;
use crate::error::{spi, SdError};
use crate::privilege;

/// Changes a transaction keeps waiting for their versions; past this it takes the version lock
/// at once (the waiting history is memory: about half a kilobyte per change).
pub const WAITING_LIMIT: usize = 10_000;

struct Frame {
    /// The directory table the statement wrote to: a frame whose table was dropped (the
    /// extension dropped, perhaps made anew, in the same transaction) has nothing left to stamp.
    table: pg_sys::Oid,
    /// The subtransaction level whose rows the frame holds: a subtransaction's commit hands its
    /// frames to its parent, its rollback drops them.
    level: i32,
    /// Statement triggers begun and not yet ended.
    open: u32,
    /// The version rows were stamped with before the statement had its bump.
    predicted: Option<i64>,
    /// The bump, and the level of the subtransaction that made it: undone if that
    /// subtransaction is rolled back before it has handed the bump to the frame's own level.
    bump: Option<(Bump, i32)>,
    /// Where each changed row was written, and the version it was stamped with.
    stamped: Vec<(pg_sys::ItemPointerData, i64)>,
    /// History waiting for the bump.
    changes: Vec<Change>,
}

impl Frame {
    /// Bumped for as long as its rows last: the bump cannot be undone without them.
    fn settled(&self) -> bool {
        matches!(self.bump, Some((_, at)) if at <= self.level)
    }

    /// Nothing more to do for this frame in this transaction.
    fn finished(&self) -> bool {
        self.open == 0 && (self.settled() || (self.bump.is_none() && self.changes.is_empty()))
    }

    /// The version it has or expects.
    fn version(&self) -> Option<i64> {
        self.bump.map(|(b, _)| b.version).or(self.predicted)
    }
}

thread_local! {
    /// This transaction's frames, in the order their statements began.
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
    /// The lowest subtransaction level at which this transaction has bumped the version (and
    /// queued a notification) and not rolled it back: settled frames are not kept.
    static BUMPED: Cell<Option<i32>> = const { Cell::new(None) };
    /// The newest version this transaction's statements expect or got: the next one expects
    /// past it (a hint, as every expectation is).
    static EXPECTED: Cell<Option<i64>> = const { Cell::new(None) };
    /// The changes waiting in this transaction's frames.
    static WAITING: Cell<usize> = const { Cell::new(0) };
}

fn nest_level() -> i32 {
    // SAFETY: reads the backend's transaction state.
    unsafe { pg_sys::GetCurrentTransactionNestLevel() }
}

/// The frame of the statement running now (the innermost one open), handed to `f`.
fn with_running<R>(f: impl FnOnce(Option<&mut Frame>) -> R) -> R {
    FRAMES.with_borrow_mut(|frames| f(frames.iter_mut().rev().find(|f| f.open > 0)))
}

/// The row and statement triggers a statement of the directory needs, by name: a change its
/// row triggers did not see would be stamped but never versioned, recorded or notified.
const NEEDED: [&std::ffi::CStr; 3] = [
    c"shard_directory_guard",
    c"shard_directory_history",
    c"shard_directory_changed",
];

/// Refuses a statement on `relation` when one of [`NEEDED`] would not fire in this session (it
/// is dropped or disabled, or the session is a replica's).
fn require_triggers(relation: pg_sys::Relation) {
    super::replica::refuse_replica_role("shard_directory");
    // SAFETY: the trigger descriptor lives as long as the open relation (the trigger's).
    let triggers = unsafe {
        let desc = (*relation).trigdesc;
        if desc.is_null() {
            &[][..]
        } else {
            crate::catalog::slice((*desc).triggers, (*desc).numtriggers)
        }
    };
    for needed in NEEDED {
        let fires = triggers.iter().any(|t| {
            // SAFETY: a trigger's name is a NUL-terminated string of the descriptor's.
            let name = unsafe { std::ffi::CStr::from_ptr(t.tgname) };
            let enabled = t.tgenabled as u8;
            name == needed
                && (enabled == pg_sys::TRIGGER_FIRES_ALWAYS
                    || enabled == pg_sys::TRIGGER_FIRES_ON_ORIGIN)
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
    let joined = with_running(|running| match running {
        Some(f) if f.level == level => {
            f.open += 1;
            true
        }
        _ => false,
    });
    if !joined {
        require_triggers(relation);
        FRAMES.with_borrow_mut(|frames| {
            frames.push(Frame {
                // SAFETY: the trigger's relation, open while it runs.
                table: unsafe { (*relation).rd_id },
                level,
                open: 1,
                predicted: None,
                bump: None,
                stamped: Vec::new(),
                changes: Vec::new(),
            })
        });
    }
}

fn no_frame() -> ! {
    SdError::TriggersMissing {
        trigger: "shard_directory_statement_begin",
    }
    .raise()
}

/// The version to stamp a row of the running statement with (BEFORE ROW): its bump once made,
/// else the version it expects. Takes no lock.
pub fn stamp() -> i64 {
    match with_running(|running| running.map(|f| f.version())) {
        None => no_frame(),
        Some(Some(version)) => version,
        Some(None) => {
            let predicted = predict(EXPECTED.get());
            if predicted == 1 {
                // The database holds a directory from this change on: a publication of all its
                // tables made before would carry it.
                super::replica::refuse_publications(None, true);
            }
            EXPECTED.set(Some(predicted));
            with_running(|running| {
                if let Some(f) = running {
                    f.predicted = Some(predicted);
                }
            });
            predicted
        }
    }
}

/// Whether `version` is one the running statement stamps its rows with (a row inserted with
/// any other version was not stamped by it: a restore).
pub fn stamped_with(version: i64) -> bool {
    with_running(|running| {
        running.is_some_and(|f| f.predicted == Some(version) || f.version() == Some(version))
    })
}

/// Records a change the running statement made (AFTER ROW): `row`, where the entry was written
/// and the version it was stamped with (none for a delete), and its history. Versioned now if
/// the statement has its bump; else it waits for it.
pub fn record(row: Option<(pg_sys::ItemPointerData, i64)>, change: Change) {
    let bumped = with_running(|running| running.map(|f| (f.table, f.bump.map(|(b, _)| b))));
    let Some((table, bump)) = bumped else {
        no_frame()
    };
    if let Some(bump) = bump {
        // The bump is its level's for good here: rows of a frame are written at its level, and
        // a deeper subtransaction that bumped it has ended by then.
        let wrong = row.filter(|(_, stamped)| *stamped != bump.version);
        heap::stamp_own_rows(table, wrong.map(|(tid, _)| tid), bump.version);
        history::write(&change, bump);
        return;
    }
    with_running(|running| {
        if let Some(f) = running {
            f.stamped.extend(row);
            f.changes.push(change);
        }
    });
    WAITING.set(WAITING.get() + 1);
    if WAITING.get() > WAITING_LIMIT {
        settle();
    }
}

/// Closes one statement trigger pair (AFTER STATEMENT).
pub fn end() {
    FRAMES.with_borrow_mut(|frames| {
        if let Some(at) = frames.iter().rposition(|f| f.open > 0) {
            frames[at].open -= 1;
            if frames[at].finished() {
                frames.remove(at);
            }
        }
    });
}

/// Gives every statement of this transaction that changed the directory and has no version yet
/// its version, in the order they expected them, under the lock that orders versions (held
/// from here to the transaction's end): its rows stamped again where the stamp was wrong, its
/// history written, its version notified. Called at pre-commit, and by what needs its version
/// before then.
pub fn settle() {
    if FRAMES.with_borrow(Vec::is_empty) {
        return; // every commit of every backend that loaded the library comes here
    }
    let level = nest_level();
    let table = catalog::try_relation(c"shard_directory");
    FRAMES.with_borrow_mut(|frames| {
        // Frames whose table is gone (the extension dropped in this transaction) are moot.
        frames.retain(|f| Some(f.table) == table);
        let mut waiting: Vec<&mut Frame> = frames
            .iter_mut()
            .filter(|f| f.bump.is_none() && !f.changes.is_empty())
            .collect();
        waiting.sort_by_key(|f| f.predicted);
        for f in waiting {
            let b = bump();
            let wrong = f.stamped.iter().filter(|(_, s)| *s != b.version);
            heap::stamp_own_rows(f.table, wrong.map(|(tid, _)| *tid), b.version);
            for change in &f.changes {
                history::write(change, b);
            }
            f.bump = Some((b, level));
        }
        forget_settled(frames);
    });
}

/// Drops what settled frames kept for their bump (nothing can undo it now), and the frames that
/// have nothing more to do; counts what still waits.
fn forget_settled(frames: &mut Vec<Frame>) {
    for f in frames.iter_mut().filter(|f| f.settled()) {
        f.stamped = Vec::new();
        f.changes = Vec::new();
    }
    frames.retain(|f| !f.finished());
    WAITING.set(
        frames
            .iter()
            .filter(|f| f.bump.is_none())
            .map(|f| f.changes.len())
            .sum(),
    );
}

/// Refuses to prepare (two-phase commit) a transaction that changed the directory: its
/// versions are taken at commit, and a prepared transaction cannot notify.
pub fn refuse_prepare() {
    let waiting = FRAMES.with_borrow(|frames| frames.iter().any(|f| !f.changes.is_empty()));
    if waiting || BUMPED.get().is_some() {
        SdError::PrepareRefused.raise();
    }
}

/// The version table's OID.
fn version_table() -> pg_sys::Oid {
    catalog::relation(c"shard_directory_version")
}

/// The lock that orders versions: every writer of the version row takes it before reading the
/// row and holds it until its transaction ends, so versions follow commit order. A lock on the
/// version table as an object (`pg_locks.locktype = 'object'`), not on the table itself: readers
/// and autovacuum never wait for it. Returns the version table's OID.
pub fn lock_versions() -> pg_sys::Oid {
    let relid = version_table();
    // SAFETY: plain values; PostgreSQL releases the lock when the transaction ends.
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
/// (a writer that has bumped commits before this statement gets the lock), and past `after`,
/// what this transaction's earlier statements expect. Wrong when another writer bumps first, or
/// one rolls back: the rows are then stamped again.
fn predict(after: Option<i64>) -> i64 {
    let next = latest::get().map_or_else(
        || {
            // Not preloaded: the newest version row, and whether a writer is changing it.
            let table = "shard_directory_version";
            let (version, pending) = heap::peek_singleton(version_table(), table, c"version");
            // SAFETY: the version column is a bigint (`heap` checks its type), passed by value.
            let Some(version) = version.and_then(|d| unsafe { i64::from_datum(d, false) }) else {
                SdError::SingletonMissing { table }.raise()
            };
            version + 1 + i64::from(pending)
        },
        |latest| latest + 1,
    );
    after.map_or(next, |after| next.max(after + 1))
}

/// Takes the version lock (if this transaction does not hold it yet), bumps the version row
/// and queues its notification.
fn bump() -> Bump {
    let relid = lock_versions();
    epoch::durable();
    let hint = latest::row();
    let lineage = epoch::columns_present(relid);
    let ((bump, minted), row) =
        heap::update_singleton(relid, "shard_directory_version", hint, |read| {
            // SAFETY: both columns are passed by value (a bigint, a timestamptz), of the types
            // `heap` checks.
            let get = |name| unsafe { read(name).and_then(|d| i64::from_datum(d, false)) };
            let (Some(version), Some(at)) = (get(c"version"), get(c"updated_at")) else {
                SdError::SingletonMissing {
                    table: "shard_directory_version",
                }
                .raise()
            };
            // Never before the previous bump's time: version_at follows version order.
            // SAFETY: reads the clock.
            let at = at.max(unsafe { pg_sys::GetCurrentTimestamp() });
            let bump = Bump {
                version: version + 1,
                at: spi("version time", TimestampWithTimeZone::try_from(at)),
            };
            let mut columns = vec![
                (c"version", bump.version.into_datum()),
                (c"updated_at", bump.at.into_datum()),
            ];
            // SAFETY: the lineage columns are text (`heap` checks), copied out as read.
            let text =
                |name: &CStr| unsafe { read(name).and_then(|d| String::from_datum(d, false)) };
            let minted = epoch::on_bump(&text, lineage);
            columns.extend(minted.iter().flat_map(|m| m.columns));
            (columns, (bump, minted.map(|m| m.epoch)))
        });
    latest::set(bump.version);
    latest::set_row(row);
    notify(bump.version, minted.as_deref());
    EXPECTED.set(Some(
        EXPECTED.get().map_or(bump.version, |e| e.max(bump.version)),
    ));
    let level = nest_level();
    BUMPED.set(Some(BUMPED.get().map_or(level, |at| at.min(level))));
    bump
}

/// Raises the version to at least `version` (a restore); never lowers it. `at`, the restored
/// version row's time, is taken as it was dumped, and so is its `lineage`; whatever the restore
/// loads, the next change mints a lineage of its own (the dump's history may have gone on
/// elsewhere, from the same version, in the same lineage).
pub fn raise_to(version: i64, at: Option<TimestampWithTimeZone>, lineage: Option<String>) {
    let relid = lock_versions();
    let renew = epoch::columns_present(relid);
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
            );
            if renew {
                spi(
                    "renew the lineage of a restored directory",
                    Spi::run_with_args(
                        "UPDATE shard_directory.shard_directory_version \
                         SET lineage = coalesce($1, lineage), lineage_minted_by = '' \
                         WHERE lineage_minted_by <> '' OR lineage IS DISTINCT FROM coalesce($1, lineage)",
                        &[lineage.into()],
                    ),
                );
            }
        })
    });
}

/// Queues the notification of `version`, delivered at commit only; when it begins an epoch
/// (`minted`), that epoch's notification first, so that a watcher hears which history the version
/// belongs to before the version.
fn notify(version: i64, minted: Option<&str>) {
    if let Some(epoch) = minted {
        super::notify::send(EPOCH_CHANNEL, &format!("{version} {epoch}"));
    }
    super::notify::send(CHANNEL, &version.to_string());
}

/// Called by `crate::xact` when a subtransaction commits: its frames, and the bumps it made for
/// its parent's frames, are its parent's now.
pub fn commit_subtransaction() {
    let level = nest_level();
    if BUMPED.get() == Some(level) {
        BUMPED.set(Some(level - 1));
    }
    FRAMES.with_borrow_mut(|frames| {
        for f in frames.iter_mut() {
            if f.level == level {
                f.level = level - 1;
            }
            if let Some((_, at)) = &mut f.bump {
                if *at == level {
                    *at = level - 1;
                }
            }
        }
        forget_settled(frames);
    });
}

/// Called by `crate::xact` while a subtransaction is rolled back: the frames it opened (at its
/// level, or deeper) end with it; a bump it made for an earlier frame is undone with its lock,
/// stamps, history and notification, and made again later.
pub fn abort_subtransaction() {
    let level = nest_level();
    if BUMPED.get().is_some_and(|at| at >= level) {
        BUMPED.set(None);
    }
    FRAMES.with_borrow_mut(|frames| {
        frames.retain(|f| f.level < level);
        for f in frames.iter_mut() {
            if matches!(f.bump, Some((_, at)) if at >= level) {
                f.bump = None;
            }
        }
        forget_settled(frames);
    });
}

/// Called by `crate::xact` when the transaction ends: no frame outlives its transaction.
pub fn clear() {
    FRAMES.with_borrow_mut(Vec::clear);
    BUMPED.set(None);
    EXPECTED.set(None);
    WAITING.set(0);
}
