//! One version bump per statement that changes the directory.
//!
//! A BEFORE STATEMENT trigger opens a frame; the first row the statement changes bumps
//! `shard_directory_version` (the row lock serialises concurrent writers until commit, so
//! versions follow commit order) and every row of the statement is stamped with that value; the
//! AFTER STATEMENT trigger closes the frame and notifies if something was bumped. A statement
//! that changes nothing opens and closes a frame and bumps nothing.

use std::cell::RefCell;

use pgrx::prelude::*;

use crate::error::SdError;

struct Frame {
    /// Transaction nesting level at which the statement began: a frame above the current level
    /// belongs to a statement whose subtransaction was rolled back.
    nest_level: i32,
    version: Option<i64>,
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

fn nest_level() -> i32 {
    unsafe { pg_sys::GetCurrentTransactionNestLevel() }
}

/// Drops frames left behind by statements that failed inside a rolled-back subtransaction.
fn discard_abandoned(frames: &mut Vec<Frame>) {
    let level = nest_level();
    while frames.last().is_some_and(|f| f.nest_level > level) {
        frames.pop();
    }
}

pub fn begin() {
    FRAMES.with_borrow_mut(|frames| {
        discard_abandoned(frames);
        frames.push(Frame {
            nest_level: nest_level(),
            version: None,
        });
    });
}

/// The version of the statement now running; the first call bumps the global version.
pub fn current() -> i64 {
    let known = FRAMES.with_borrow_mut(|frames| {
        discard_abandoned(frames);
        frames.last().map(|f| f.version)
    });
    match known {
        None => SdError::TriggersMissing.raise(),
        Some(Some(v)) => v,
        Some(None) => {
            let v = bump();
            FRAMES.with_borrow_mut(|frames| {
                if let Some(top) = frames.last_mut() {
                    top.version = Some(v);
                }
            });
            v
        }
    }
}

/// Closes the statement's frame and returns the version it bumped to, if any.
pub fn end() -> Option<i64> {
    FRAMES.with_borrow_mut(|frames| {
        discard_abandoned(frames);
        frames.pop().and_then(|f| f.version)
    })
}

fn bump() -> i64 {
    Spi::connect_mut(|c| {
        c.update(
            "UPDATE shard_directory.shard_directory_version \
             SET version = version + 1, updated_at = now() RETURNING version",
            None,
            &[],
        )?
        .first()
        .get_one::<i64>()
    })
    .expect("bump shard_directory_version")
    .expect("shard_directory_version has its row")
}

/// `pg_notify` has no C entry point in pgrx: go through SQL. Delivered at commit only.
pub fn notify(version: i64) {
    Spi::run_with_args(
        "SELECT pg_catalog.pg_notify('shard_directory', $1)",
        &[version.to_string().into()],
    )
    .expect("pg_notify");
}

/// Called by `crate::xact` when the transaction ends: no frame outlives its transaction.
pub fn clear() {
    FRAMES.with_borrow_mut(Vec::clear);
}
