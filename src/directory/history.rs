//! Append-only history of directory entries, and the questions it answers.

use pgrx::prelude::*;

use super::row::Entry;
use super::statement::Bump;
use super::transition::Transition;
use super::writer::{self, Writer};
use crate::catalog;
use crate::error::{required, spi};
use crate::plans::Plan;
use crate::privilege;
use pgrx::pg_sys::PgBuiltInOids;

fn history_table() -> pg_sys::Oid {
    catalog::relation(c"shard_directory_history")
}

/// One history row, written as the table's owner on behalf of `changed_by`: writers hold no
/// privilege on history, so they cannot forge it.
pub fn record(
    old: Option<&Entry>,
    new: &Option<Entry>,
    transition: Transition,
    bump: Bump,
    changed_by: &str,
) {
    let new = new.as_ref();
    let op = match (old, new) {
        (None, _) => "insert",
        (_, None) => "delete",
        _ => "update",
    };
    let Some(key) = new.or(old).map(|e| &e.key) else {
        return;
    };
    let shard = |e: Option<&Entry>| e.map(|e| e.placement.shard_name.clone());
    let state = |e: Option<&Entry>| e.map(|e| e.placement.state.as_str().to_owned());
    let target = |e: Option<&Entry>| e.and_then(|e| e.placement.target_shard.clone());
    let region = |e: Option<&Entry>| e.and_then(|e| e.region.clone());
    privilege::as_owner_of(history_table(), || {
        spi(
            "record history",
            Spi::connect_mut(|c| {
                let plan = RECORD.kept(c)?;
                c.update(
                    &*plan,
                    None,
                    &[
                        op.into(),
                        transition.as_str().into(),
                        key.entity_type.as_str().into(),
                        key.entity_id.as_str().into(),
                        shard(old).into(),
                        shard(new).into(),
                        state(old).into(),
                        state(new).into(),
                        target(old).into(),
                        target(new).into(),
                        region(old).into(),
                        region(new).into(),
                        bump.version.into(),
                        bump.at.into(),
                        changed_by.into(),
                    ],
                )
                .map(|_| ())
            }),
        )
    });
}

const TEXT: PgBuiltInOids = PgBuiltInOids::TEXTOID;

// Its 15 parameters: 12 texts, the version, its time, the writer (laid out by hand).
#[rustfmt::skip]
static RECORD: Plan = Plan {
    sql: "INSERT INTO shard_directory.shard_directory_history \
          (op, transition, entity_type, entity_id, old_shard, new_shard, old_state, new_state, \
           old_target, new_target, old_region, new_region, version, version_at, changed_by) \
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
    args: &[
        TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT,
        PgBuiltInOids::INT8OID, PgBuiltInOids::TIMESTAMPTZOID, TEXT,
    ],
    mutating: true,
};

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

/// Removes history older than `before`. Not executable by PUBLIC: the extension's owner grants
/// EXECUTE to the DBA who may purge; it runs with the owner's rights.
#[pg_extern(volatile)]
fn purge_history(before: Option<TimestampWithTimeZone>) -> i64 {
    let before = required(before, "before");
    privilege::as_owner_of(history_table(), || {
        writer::as_writer(Writer::Purge, || {
            spi(
                "purge history",
                Spi::connect_mut(|c| {
                    c.update(
                        "DELETE FROM shard_directory.shard_directory_history WHERE version_at < $1",
                        None,
                        &[before.into()],
                    )
                    .map(|t| t.len() as i64)
                }),
            )
        })
    })
}
