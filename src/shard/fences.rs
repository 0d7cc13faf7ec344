//! The DBA's shard-side controls: `raise_min_accepted` and the per-entity fences, plus the
//! triggers that make any change to `shard_settings` / `shard_fences` (through these functions or
//! by hand) take the exclusive lock and invalidate every backend's cached copy at commit.
//!
//! None of these functions is executable by PUBLIC; a role granted EXECUTE needs no privilege on
//! the tables: the functions write them as their owner.

use pgrx::datum::Interval;
use pgrx::prelude::*;

use super::cached;
use super::key;
use super::locks;
use crate::entity::EntityKey;
use crate::error::{required, spi, SdError};
use crate::{catalog, privilege, TriggerResult};

/// Runs an SPI write on the shard's tables as their owner.
fn write(during: &'static str, sql: &str, args: &[pgrx::datum::DatumWithOid]) {
    privilege::as_owner_of(cached::tables().settings, || {
        spi(during, Spi::run_with_args(sql, args))
    });
}

/// Raises the shard-wide minimum version. Waits for the checked transactions in flight; refuses
/// a value that is not above the current minimum.
#[pg_extern(volatile)]
fn raise_min_accepted(v: Option<i64>) -> i64 {
    let v = required(v, "v");
    locks::exclusive(cached::tables().settings, || {
        format!("raise_min_accepted({v})")
    });
    let current = cached::min_accepted();
    if v <= current {
        SdError::MinAcceptedNotRaised {
            requested: v,
            current,
        }
        .raise();
    }
    write(
        "update shard_settings",
        "UPDATE shard_directory.shard_settings SET min_accepted = $1, updated_at = now()",
        &[v.into()],
    );
    v
}

/// Upserts the entity's fence; the row trigger takes the entity's exclusive lock. The id must be
/// canonical for the key columns of its type's protected tables, or its rows' keys, which always
/// are, would never find the fence.
fn set_fence(
    key: EntityKey,
    fence_state: &str,
    min_version: Option<i64>,
    moved_to: Option<&str>,
    lease: Option<Interval>,
) {
    let columns = privilege::as_owner_of(cached::tables().settings, || {
        key::columns_of(&key.entity_type)
    });
    key::require_canonical(&key.entity_type, &key.entity_id, &columns);
    write(
        "set fence",
        "INSERT INTO shard_directory.shard_fences AS f \
             (entity_type, entity_id, state, min_version, moved_to, lease_until) \
         VALUES ($1, $2, $3, coalesce($4, 0), $5, clock_timestamp() + $6) \
         ON CONFLICT (entity_type, entity_id) DO UPDATE \
         SET state = excluded.state, min_version = coalesce($4, f.min_version), \
             moved_to = excluded.moved_to, lease_until = excluded.lease_until, updated_at = now()",
        &[
            key.entity_type.as_str().into(),
            key.entity_id.as_str().into(),
            fence_state.into(),
            min_version.into(),
            moved_to.into(),
            lease.into(),
        ],
    );
}

/// The entity lives here; clients below `min_version` are refused for it.
#[pg_extern(volatile)]
fn fence_owned(entity_type: Option<&str>, entity_id: Option<&str>, min_version: Option<i64>) {
    let min_version = required(min_version, "min_version");
    set_fence(
        crate::entity::key_of(entity_type, entity_id),
        "owned",
        Some(min_version),
        None,
        None,
    );
}

/// The entity's final catch-up is running: every request for it is refused, retryably.
#[pg_extern(volatile)]
fn fence_frozen(entity_type: Option<&str>, entity_id: Option<&str>) {
    set_fence(
        crate::entity::key_of(entity_type, entity_id),
        "frozen",
        None,
        None,
        None,
    );
}

/// As `fence_frozen`, for `lease` only (counted from when the fence takes effect): then the
/// entity is governed as if fenced owned with a minimum one above `freeze_version`, the
/// directory version of its freeze. The mover freezes this way, so an entity whose mover vanished
/// is not frozen for good, and no client that has not seen the directory since the freeze gets
/// through.
#[pg_extern(volatile, name = "fence_frozen")]
fn fence_frozen_for(
    entity_type: Option<&str>,
    entity_id: Option<&str>,
    lease: Option<Interval>,
    freeze_version: Option<i64>,
) {
    let lease = required(lease, "lease");
    let freeze_version = required(freeze_version, "freeze_version");
    set_fence(
        crate::entity::key_of(entity_type, entity_id),
        "frozen",
        Some(freeze_version.saturating_add(1)),
        None,
        Some(lease),
    );
}

/// The entity's cutover is being committed in the directory: every request for it, reads too, is
/// refused retryably (reason `frozen`), for `lease` only (counted from when the fence takes
/// effect): then it is governed as if fenced owned with a minimum of `cutover_version`. The mover
/// sets it after `complete_move` took `cutover_version` and before that commits (the directory's
/// version lock held meanwhile): no reader is served by the source once the target may be
/// written, and once the lease ends only the clients that saw the cutover (they route to its
/// target), or the abort that follows a cutover that never committed (its version is at least
/// that), get through.
#[pg_extern(volatile)]
fn fence_cutover(
    entity_type: Option<&str>,
    entity_id: Option<&str>,
    lease: Option<Interval>,
    cutover_version: Option<i64>,
) {
    let lease = required(lease, "lease");
    let cutover_version = required(cutover_version, "cutover_version");
    set_fence(
        crate::entity::key_of(entity_type, entity_id),
        "cutover",
        Some(cutover_version),
        None,
        Some(lease),
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
        crate::entity::key_of(entity_type, entity_id),
        "moved",
        Some(version),
        Some(moved_to),
        None,
    );
}

/// Removes the entity's fence: `min_accepted` alone governs it again.
#[pg_extern(volatile)]
fn unfence(entity_type: Option<&str>, entity_id: Option<&str>) {
    let key = crate::entity::key_of(entity_type, entity_id);
    write(
        "unfence",
        "DELETE FROM shard_directory.shard_fences WHERE entity_type = $1 AND entity_id = $2",
        &[
            key.entity_type.as_str().into(),
            key.entity_id.as_str().into(),
        ],
    );
}

fn invalidate(relid: pg_sys::Oid) {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
}

/// BEFORE ROW on `shard_settings`: one row, `min_accepted` never lowered, exclusive lock, and
/// every backend's cached value invalidated at commit. The table's owner restoring a dump raises
/// `min_accepted` to the restored value (never lowers it).
#[pg_trigger]
pub fn shard_settings_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    catalog::require_own_table(
        trigger.trigger_data().tg_relation,
        "shard_settings_guard",
        c"shard_settings",
    );
    let min = |t: Option<PgHeapTuple<'a, _>>| {
        t.and_then(|t| spi("min_accepted", t.get_by_name::<i64>("min_accepted")))
            .unwrap_or(0)
    };
    let tables = cached::tables();
    match spi("trigger operation", trigger.op()) {
        PgTriggerOperation::Update => {
            let (current, requested) = (min(trigger.old()), min(trigger.new()));
            locks::exclusive(tables.settings, || {
                format!("UPDATE of shard_settings.min_accepted to {requested}")
            });
            if requested < current {
                SdError::MinAcceptedNotRaised { requested, current }.raise();
            }
            invalidate(tables.settings);
            Ok(trigger.new().map(PgHeapTuple::into_owned))
        }
        PgTriggerOperation::Insert if privilege::current_role_owns(tables.settings) => {
            let at = trigger.new().and_then(|t| {
                spi(
                    "updated_at",
                    t.get_by_name::<TimestampWithTimeZone>("updated_at"),
                )
            });
            write(
                "restore shard_settings",
                "UPDATE shard_directory.shard_settings SET min_accepted = $1, updated_at = coalesce($2, updated_at) \
                 WHERE min_accepted <= $1",
                &[min(trigger.new()).into(), at.into()],
            );
            Ok(None)
        }
        PgTriggerOperation::Insert => SdError::SettingsRowFixed { op: "INSERT" }.raise(),
        _ => SdError::SettingsRowFixed { op: "DELETE" }.raise(),
    }
}

/// BEFORE ROW on `shard_fences`: the exclusive lock, and every backend's cached fences
/// invalidated at commit.
#[pg_trigger]
pub fn shard_fences_changed<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    catalog::require_own_table(
        trigger.trigger_data().tg_relation,
        "shard_fences_changed",
        c"shard_fences",
    );
    let tables = cached::tables();
    locks::exclusive(tables.settings, || {
        let key = trigger.new().or_else(|| trigger.old()).map(|t| {
            let text = |c: &str| spi("fence key", t.get_by_name::<String>(c)).unwrap_or_default();
            EntityKey {
                entity_type: text("entity_type"),
                entity_id: text("entity_id"),
            }
        });
        match key {
            Some(key) => format!("fence change for {key}"),
            None => "fence change".to_owned(),
        }
    });
    invalidate(tables.fences);
    Ok(trigger
        .new()
        .or_else(|| trigger.old())
        .map(PgHeapTuple::into_owned))
}
