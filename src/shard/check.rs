//! The shard-side rule, run on every request: the client's directory version against
//! `min_accepted`, then against the entity's fence.

use pgrx::prelude::*;

use super::bypass;
use super::locks::{self, Mode};
use super::state::{self, Fence};
use super::stats::{self, Counter};
use crate::entity::EntityKey;
use crate::error::SdError;
use crate::guc::Request;
use crate::TriggerResult;

fn refuse(e: SdError) -> ! {
    if let Some(r) = e.rejection() {
        stats::count(Counter::Rejected(r));
    }
    e.raise()
}

/// Shard-wide: the lock, then `min_accepted`.
fn check_shard(version: Option<i64>) {
    stats::count(Counter::Checks);
    locks::shard_wide(state::tables().settings, Mode::Shared);
    let minimum = state::min_accepted();
    match version {
        Some(v) if v >= minimum => {}
        client => refuse(SdError::StaleDirectory { client, minimum }),
    }
}

/// One entity: its lock, then its fence. `version` has passed `check_shard` already.
fn check_entity(key: &EntityKey, version: Option<i64>) {
    locks::entity(key, Mode::Shared);
    match state::fence(key) {
        Some(Fence::Owned { min_version }) if version.is_none_or(|v| v < min_version) => {
            refuse(SdError::StaleEntity {
                entity: key.clone(),
                client: version,
                minimum: min_version,
            })
        }
        None | Some(Fence::Owned { .. }) => {}
        Some(Fence::Frozen) => refuse(SdError::EntityFrozen {
            entity: key.clone(),
        }),
        Some(Fence::Moved {
            moved_to,
            version: moved_at,
        }) => refuse(SdError::EntityMoved {
            entity: key.clone(),
            moved_to,
            version: moved_at,
            client: version,
        }),
    }
}

/// The client's declared version (and entity, if it declared one), checked.
fn check_request() {
    let request = Request::read().unwrap_or_else(|e| {
        stats::count(Counter::Checks);
        refuse(e)
    });
    check_shard(request.version);
    if let Some(key) = &request.entity {
        check_entity(key, request.version);
    }
}

/// Raises 40001 when the client's `app.directory_version` is unset or below `min_accepted`, or
/// when the entity it declared (`app.entity_type`, `app.entity_id`) is frozen, moved, or fenced
/// above the client's version. Holds shared locks until commit so no fence slips in between.
#[pg_extern(volatile, parallel_restricted)]
fn assert_directory_version() {
    check_request();
}

/// Statement trigger installed by `protect(table)`: every INSERT, UPDATE, DELETE and TRUNCATE of
/// the table is checked as if the application had called `assert_directory_version()`.
#[pg_trigger]
pub fn shard_directory_protect_statement<'a>(_trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    check_request();
    Ok(None)
}

/// Row trigger installed by `protect(table, key_column, entity_type)`: each row's entity is
/// checked against its fence with the client's version, so a statement touching a moved tenant's
/// row is refused whole. The key is read through the column type's output function, so any key
/// type works.
#[pg_trigger]
pub fn shard_directory_protect_row<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let args = trigger.extra_args().expect("trigger arguments");
    let broken = |problem: String| SdError::ProtectionBroken {
        trigger: format!(
            "shard_directory_protect_row on {}",
            trigger.table_name().unwrap_or_default()
        ),
        problem,
    };
    let [key_column, entity_type] = args.as_slice() else {
        broken(format!(
            "expected (key_column, entity_type), found {} arguments",
            args.len()
        ))
        .raise()
    };
    let request = Request::read().unwrap_or_else(|e| refuse(e));
    let data = trigger.trigger_data();
    let tupdesc = unsafe { (*data.tg_relation).rd_att };
    let key_of = |tuple: *mut pg_sys::HeapTupleData| -> Option<EntityKey> {
        if tuple.is_null() {
            return None;
        }
        let column = std::ffi::CString::new(key_column.as_str()).ok()?;
        unsafe {
            let attno = pg_sys::SPI_fnumber(tupdesc, column.as_ptr());
            if attno <= 0 {
                broken(format!("key column \"{key_column}\" no longer exists")).raise();
            }
            let value = pg_sys::SPI_getvalue(tuple, tupdesc, attno);
            (!value.is_null()).then(|| EntityKey {
                entity_type: entity_type.clone(),
                entity_id: std::ffi::CStr::from_ptr(value)
                    .to_string_lossy()
                    .into_owned(),
            })
        }
    };
    let event = data.tg_event;
    let fired_for_update = event & pg_sys::TRIGGER_EVENT_OPMASK == pg_sys::TRIGGER_EVENT_UPDATE;
    let old = key_of(data.tg_trigtuple);
    let new = if fired_for_update {
        key_of(data.tg_newtuple)
    } else {
        None
    };
    let mut keys: Vec<EntityKey> = old.into_iter().chain(new).collect();
    keys.dedup();
    // The statement trigger that `protect` installs with this one has checked the shard-wide rule.
    for key in keys.iter().filter(|k| !bypass::passes(k)) {
        check_entity(key, request.version);
    }
    Ok(trigger
        .new()
        .or_else(|| trigger.old())
        .map(PgHeapTuple::into_owned))
}
