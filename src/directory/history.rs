//! Append-only history of directory entries, and the questions it answers.

use pgrx::prelude::*;

use super::heap;
use super::row::Entry;
use super::transition::Transition;
use super::writer::{self, Writer};
use crate::catalog;
use crate::error::{required, spi};
use crate::privilege;

/// The version a statement bumped to, and when: the time is taken while the version row is
/// locked and never goes below the previous bump's, so it follows version (and commit) order.
#[derive(Clone, Copy)]
pub struct Bump {
    pub version: i64,
    pub at: TimestampWithTimeZone,
}

/// When the transaction started (`now()`): what `changed_at` and an entry's `updated_at`
/// record.
pub fn transaction_start() -> TimestampWithTimeZone {
    spi(
        "transaction start",
        // SAFETY: reads the transaction's start time.
        TimestampWithTimeZone::try_from(unsafe { pg_sys::GetCurrentTransactionStartTimestamp() }),
    )
}

fn history_table() -> pg_sys::Oid {
    catalog::relation(c"shard_directory_history")
}

/// One change of an entry, as its history row will record it once its statement has a version.
pub struct Change {
    pub old: Option<Entry>,
    pub new: Option<Entry>,
    pub transition: Transition,
    /// The role that made the change (the history row is written later, perhaps as another).
    pub changed_by: String,
}

/// Writes `change`'s history row with its statement's `bump`, on behalf of the role that made
/// it: writers hold no privilege on history, so they cannot forge it.
pub fn write(change: &Change, bump: Bump) {
    let (old, new) = (change.old.as_ref(), change.new.as_ref());
    let op = match (old, new) {
        (None, _) => "insert",
        (_, None) => "delete",
        _ => "update",
    };
    let Some(key) = new.or(old).map(|e| &e.key) else {
        return;
    };
    let shard = |e: Option<&Entry>| e.map(|e| e.placement.shard_name.as_str()).into_datum();
    let state = |e: Option<&Entry>| e.map(|e| e.placement.state.as_str()).into_datum();
    let target = |e: Option<&Entry>| {
        e.and_then(|e| e.placement.target_shard.as_deref())
            .into_datum()
    };
    let region = |e: Option<&Entry>| e.and_then(|e| e.region.as_deref()).into_datum();
    let txid = unsafe { pg_sys::GetTopFullTransactionId() }.value as i64;
    let changed_at = transaction_start();
    heap::insert(
        history_table(),
        &[
            (c"op", op.into_datum()),
            (c"transition", change.transition.as_str().into_datum()),
            (c"entity_type", key.entity_type.as_str().into_datum()),
            (c"entity_id", key.entity_id.as_str().into_datum()),
            (c"old_shard", shard(old)),
            (c"new_shard", shard(new)),
            (c"old_state", state(old)),
            (c"new_state", state(new)),
            (c"old_target", target(old)),
            (c"new_target", target(new)),
            (c"old_region", region(old)),
            (c"new_region", region(new)),
            (c"version", bump.version.into_datum()),
            (c"version_at", bump.at.into_datum()),
            (c"changed_at", changed_at.into_datum()),
            (c"changed_by", change.changed_by.as_str().into_datum()),
            (c"txid", txid.into_datum()),
        ],
    );
}

/// The shard that held the entity at `at`, from history; NULL if it did not exist then. History
/// is ordered by version, which follows commit order; `version_at` is when each version was
/// taken, and increases with it.
#[pg_extern(stable, parallel_safe)]
fn placement_at(
    entity_type: Option<&str>,
    entity_id: Option<&str>,
    at: Option<TimestampWithTimeZone>,
) -> Option<String> {
    let entity_type = required(entity_type, "entity_type");
    let entity_id = required(entity_id, "entity_id");
    let at = required(at, "at");
    spi(
        "read history",
        Spi::connect(|c| {
            let rows = c.select(
                "SELECT new_shard FROM shard_directory.shard_directory_history \
                 WHERE entity_type = $1 AND entity_id = $2 AND version_at <= $3 \
                 ORDER BY version DESC, history_id DESC LIMIT 1",
                Some(1),
                &[entity_type.into(), entity_id.into(), at.into()],
            )?;
            if rows.is_empty() {
                Ok::<_, pgrx::spi::SpiError>(None)
            } else {
                rows.first().get_one::<String>()
            }
        }),
    )
}

/// Removes history older than `before`, oldest version first: the versions removed are those
/// below the first one taken at or after `before`, so what stays is every version from there on
/// (`changes_since` answers `complete` only over versions history holds). `version_at` follows
/// version order, except in rows carried over from 0.1.0, where it is the transaction's start.
/// Not executable by PUBLIC: the extension's owner grants EXECUTE to the DBA who may purge; it
/// runs with the owner's rights.
#[pg_extern(volatile)]
fn purge_history(before: Option<TimestampWithTimeZone>) -> i64 {
    let before = required(before, "before");
    privilege::as_owner_of(history_table(), || {
        writer::as_writer(Writer::Purge, || {
            spi(
                "purge history",
                Spi::connect_mut(|c| {
                    c.update(
                        "DELETE FROM shard_directory.shard_directory_history WHERE version < \
                           coalesce((SELECT min(version) FROM shard_directory.shard_directory_history \
                                      WHERE version_at >= $1), \
                                    (SELECT max(version) + 1 FROM shard_directory.shard_directory_history))",
                        None,
                        &[before.into()],
                    )
                    .map(|t| t.len() as i64)
                }),
            )
        })
    })
}
