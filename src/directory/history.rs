//! Append-only history of directory entries, and the questions it answers.

use std::cell::Cell;

use pgrx::prelude::*;

use super::row::Entry;
use super::transition::Transition;
use crate::error::{required, SdError};

/// Who is writing to `shard_directory_history` right now, if anyone: the guard trigger on the
/// history table lets exactly these two through.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Recorder,
    Purge,
}

thread_local! {
    static WRITER: Cell<Option<Writer>> = const { Cell::new(None) };
}

pub fn writing(w: Writer) -> bool {
    WRITER.get() == Some(w)
}

/// Restores the previous writer even when the statement errors out (pgrx unwinds through Drop).
struct WriterScope(Option<Writer>);

impl WriterScope {
    fn enter(w: Writer) -> Self {
        WriterScope(WRITER.replace(Some(w)))
    }
}

impl Drop for WriterScope {
    fn drop(&mut self) {
        WRITER.set(self.0);
    }
}

pub fn record(old: Option<&Entry>, new: Option<&Entry>, transition: Transition, version: i64) {
    let op = match (old, new) {
        (None, _) => "insert",
        (_, None) => "delete",
        _ => "update",
    };
    let key = &new.or(old).expect("a row").key;
    let shard = |e: Option<&Entry>| e.map(|e| e.placement.shard_name.clone());
    let state = |e: Option<&Entry>| e.map(|e| e.placement.state.as_str().to_owned());
    let target = |e: Option<&Entry>| e.and_then(|e| e.placement.target_shard.clone());
    let region = |e: Option<&Entry>| e.and_then(|e| e.region.clone());
    let _scope = WriterScope::enter(Writer::Recorder);
    Spi::run_with_args(
        "INSERT INTO shard_directory.shard_directory_history \
         (op, transition, entity_type, entity_id, old_shard, new_shard, old_state, new_state, \
          old_target, new_target, old_region, new_region, version) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
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
            version.into(),
        ],
    )
    .expect("record history");
}

/// The shard that held the entity at `at`, from history; NULL if it did not exist then.
#[pg_extern(stable, parallel_safe)]
fn placement_at(
    entity_type: Option<&str>,
    entity_id: Option<&str>,
    at: Option<TimestampWithTimeZone>,
) -> Option<String> {
    let entity_type = required(entity_type, "entity_type");
    let entity_id = required(entity_id, "entity_id");
    let at = required(at, "at");
    Spi::connect(|c| {
        let rows = c.select(
            "SELECT new_shard FROM shard_directory.shard_directory_history \
             WHERE entity_type = $1 AND entity_id = $2 AND changed_at <= $3 \
             ORDER BY changed_at DESC, history_id DESC LIMIT 1",
            Some(1),
            &[entity_type.into(), entity_id.into(), at.into()],
        )?;
        if rows.is_empty() {
            Ok(None)
        } else {
            rows.first().get_one::<String>()
        }
    })
    .expect("read history")
}

/// Removes history older than `before`; for the extension's owner (or a member of its role).
#[pg_extern(volatile)]
fn purge_history(before: Option<TimestampWithTimeZone>) -> i64 {
    let before = required(before, "before");
    let owner = Spi::get_one::<bool>(
        "SELECT pg_catalog.pg_has_role(current_user, e.extowner, 'MEMBER') \
         FROM pg_catalog.pg_extension e WHERE e.extname = 'shard_directory'",
    )
    .expect("check extension owner")
    .unwrap_or(false);
    if !owner {
        let role = Spi::get_one::<String>("SELECT current_user::text")
            .expect("current_user")
            .unwrap_or_default();
        SdError::NotExtensionOwner { role }.raise();
    }
    let _scope = WriterScope::enter(Writer::Purge);
    Spi::connect_mut(|c| {
        c.update(
            "DELETE FROM shard_directory.shard_directory_history WHERE changed_at < $1",
            None,
            &[before.into()],
        )
        .map(|t| t.len() as i64)
    })
    .expect("purge history")
}
