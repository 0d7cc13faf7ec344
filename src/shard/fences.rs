//! The DBA's shard-side controls: `raise_min_accepted` and the per-entity fences, plus the
//! triggers that make any change to `shard_settings` / `shard_fences` (through these functions or
//! by hand) take the exclusive lock and invalidate every backend's cached copy at commit.

use pgrx::prelude::*;

use super::locks::{self, Mode};
use super::state;
use crate::entity::EntityKey;
use crate::error::{required, SdError};
use crate::TriggerResult;

/// Raises the shard-wide minimum version. Waits for the checked transactions in flight; refuses
/// a value that is not above the current minimum.
#[pg_extern(volatile)]
fn raise_min_accepted(v: Option<i64>) -> i64 {
    let v = required(v, "v");
    locks::shard_wide(state::tables().settings, Mode::Exclusive);
    let current = state::min_accepted();
    if v <= current {
        SdError::MinAcceptedNotRaised {
            requested: v,
            current,
        }
        .raise();
    }
    Spi::run_with_args(
        "UPDATE shard_directory.shard_settings SET min_accepted = $1, updated_at = now()",
        &[v.into()],
    )
    .expect("update shard_settings");
    v
}

/// Upserts the entity's fence; the row trigger takes the entity's exclusive lock.
fn set_fence(key: EntityKey, fence_state: &str, min_version: Option<i64>, moved_to: Option<&str>) {
    Spi::run_with_args(
        "INSERT INTO shard_directory.shard_fences AS f (entity_type, entity_id, state, min_version, moved_to) \
         VALUES ($1, $2, $3, coalesce($4, 0), $5) \
         ON CONFLICT (entity_type, entity_id) DO UPDATE \
         SET state = excluded.state, min_version = coalesce($4, f.min_version), \
             moved_to = excluded.moved_to, updated_at = now()",
        &[
            key.entity_type.as_str().into(),
            key.entity_id.as_str().into(),
            fence_state.into(),
            min_version.into(),
            moved_to.into(),
        ],
    )
    .expect("set fence");
}

/// The entity lives here; clients below `min_version` are refused for it.
#[pg_extern(volatile)]
fn fence_owned(entity_type: Option<&str>, entity_id: Option<&str>, min_version: Option<i64>) {
    let min_version = required(min_version, "min_version");
    set_fence(
        EntityKey::from_args(entity_type, entity_id),
        "owned",
        Some(min_version),
        None,
    );
}

/// The entity's final catch-up is running: every request for it is refused, retryably.
#[pg_extern(volatile)]
fn fence_frozen(entity_type: Option<&str>, entity_id: Option<&str>) {
    set_fence(
        EntityKey::from_args(entity_type, entity_id),
        "frozen",
        None,
        None,
    );
}

/// The entity now lives on `moved_to` as of directory version `version`.
#[pg_extern(volatile)]
fn fence_moved(
    entity_type: Option<&str>,
    entity_id: Option<&str>,
    moved_to: Option<&str>,
    version: Option<i64>,
) {
    let moved_to = required(moved_to, "moved_to");
    let version = required(version, "version");
    set_fence(
        EntityKey::from_args(entity_type, entity_id),
        "moved",
        Some(version),
        Some(moved_to),
    );
}

/// Removes the entity's fence: `min_accepted` alone governs it again.
#[pg_extern(volatile)]
fn unfence(entity_type: Option<&str>, entity_id: Option<&str>) {
    let key = EntityKey::from_args(entity_type, entity_id);
    Spi::run_with_args(
        "DELETE FROM shard_directory.shard_fences WHERE entity_type = $1 AND entity_id = $2",
        &[
            key.entity_type.as_str().into(),
            key.entity_id.as_str().into(),
        ],
    )
    .expect("unfence");
}

fn invalidate(relid: pg_sys::Oid) {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
}

/// BEFORE ROW on `shard_settings`: one row, `min_accepted` never lowered, exclusive lock, and
/// every backend's cached value invalidated at commit.
#[pg_trigger]
pub fn shard_settings_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let min = |t: Option<PgHeapTuple<'a, _>>| {
        t.and_then(|t| t.get_by_name::<i64>("min_accepted").ok().flatten())
            .unwrap_or(0)
    };
    match trigger.op().expect("trigger op") {
        PgTriggerOperation::Update => {
            let tables = state::tables();
            locks::shard_wide(tables.settings, Mode::Exclusive);
            let (current, requested) = (min(trigger.old()), min(trigger.new()));
            if requested < current {
                SdError::MinAcceptedNotRaised { requested, current }.raise();
            }
            invalidate(tables.settings);
            Ok(trigger.new().map(PgHeapTuple::into_owned))
        }
        PgTriggerOperation::Insert => SdError::SettingsRowFixed { op: "INSERT" }.raise(),
        _ => SdError::SettingsRowFixed { op: "DELETE" }.raise(),
    }
}

/// BEFORE ROW on `shard_fences`: the entity's exclusive lock (old and new key), and every
/// backend's cached fences invalidated at commit.
#[pg_trigger]
pub fn shard_fences_changed<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let key_of = |t: Option<PgHeapTuple<'a, _>>| {
        t.map(|t| EntityKey {
            entity_type: t
                .get_by_name::<String>("entity_type")
                .ok()
                .flatten()
                .unwrap_or_default(),
            entity_id: t
                .get_by_name::<String>("entity_id")
                .ok()
                .flatten()
                .unwrap_or_default(),
        })
    };
    for key in [key_of(trigger.old()), key_of(trigger.new())]
        .into_iter()
        .flatten()
    {
        locks::entity(&key, Mode::Exclusive);
    }
    invalidate(state::tables().fences);
    Ok(trigger
        .new()
        .or_else(|| trigger.old())
        .map(PgHeapTuple::into_owned))
}
