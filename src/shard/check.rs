//! The shard-side rule, run on every request: the client's directory version against
//! `min_accepted`, then against the entity's fence.

use std::borrow::Cow;
use std::ffi::CStr;

use pgrx::prelude::*;

use super::bypass;
use super::cached::{self, Fence};
use super::key::{self, KeyColumn};
use super::load;
use super::locks;
use super::stats::{self, Counter};
use crate::catalog;
use crate::entity::EntityRef;
use crate::error::{required, SdError};
use crate::guc::Request;
use crate::TriggerResult;

/// The names `protect` gives its triggers; the trigger functions run under these names only.
pub const STATEMENT_TRIGGER: &CStr = c"shard_directory_protect";
pub const ROW_TRIGGER: &CStr = c"shard_directory_protect_row";

fn refuse(e: SdError) -> ! {
    if let Some(r) = e.rejection() {
        stats::count(Counter::Rejected(r));
    }
    e.raise()
}

/// Shard-wide: `min_accepted`. The caller holds the check's lock ([`lock`]).
fn check_shard(version: Option<i64>) {
    let minimum = cached::min_accepted();
    match version {
        Some(v) if v >= minimum => {}
        client => refuse(SdError::StaleDirectory { client, minimum }),
    }
}

/// What a checked transaction does: a write is refused while its entity is frozen; a read is
/// not, since the source holds every row of the entity until the cutover, once that begins.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Write,
    Read,
}

/// One entity's fence. The caller holds the check's lock ([`lock`]).
fn check_entity(key: EntityRef<'_>, version: Option<i64>, access: Access) {
    match cached::fence(key) {
        Some(Fence::Owned { min_version }) if version.is_none_or(|v| v < min_version) => {
            refuse(SdError::StaleEntity {
                entity: key.to_key(),
                client: version,
                minimum: min_version,
            })
        }
        None | Some(Fence::Owned { .. }) => {}
        Some(Fence::Frozen { reads: true, .. }) if access == Access::Read => {}
        Some(Fence::Frozen { .. }) => refuse(SdError::EntityFrozen {
            entity: key.to_key(),
        }),
        Some(Fence::Moved {
            moved_to,
            version: moved_at,
        }) => refuse(SdError::EntityMoved {
            entity: key.to_key(),
            moved_to,
            version: moved_at,
            client: version,
        }),
    }
}

/// Takes the check's lock, first: what the check reads and counts comes after it.
fn lock() {
    locks::check(cached::tables().settings);
}

fn request() -> Request {
    Request::read().unwrap_or_else(|e| refuse(e))
}

/// The client's declared version (and entity, if it declared one), checked; the version, for
/// the rows that follow. Counted once the check's lock is held, so that a backend holding it
/// exclusively (a fence change, or a test reading the counts) sees no check of another backend
/// counted meanwhile.
pub(super) fn check_request(access: Access) -> Option<i64> {
    lock();
    stats::count(Counter::Checks);
    let request = request();
    check_shard(request.version);
    if let Some(key) = request.entity {
        cached::require_canonical_declared(key);
        check_entity(key, request.version, access);
        load::count(key);
    }
    request.version
}

/// A written row's entity against its fence, unless the mover's bypass lets it through. The
/// caller has checked the request (and so holds the check's lock) in this statement.
pub(super) fn check_row_entity(key: EntityRef<'_>, version: Option<i64>) {
    if !bypass::passes(key) {
        check_entity(key, version, Access::Write);
        load::count(key);
    }
}

/// The position of the key column a table was protected with, or the error saying the
/// protection is broken because the column is gone.
pub(super) fn key_attno(relation: pg_sys::Relation, key_column: &CStr) -> i32 {
    let attno = unsafe { pg_sys::SPI_fnumber((*relation).rd_att, key_column.as_ptr()) };
    if attno <= 0 {
        SdError::ProtectionBroken {
            trigger: format!(
                "shard_directory_protect_row on {}",
                catalog::relation_name(unsafe { (*relation).rd_id })
            ),
            problem: format!(
                "key column \"{}\" no longer exists",
                key_column.to_string_lossy()
            ),
        }
        .raise();
    }
    attno
}

/// How the key column's text is read. A column altered since `protect` to a type that cannot key
/// an entity is refused here.
pub(super) fn key_form(relation: pg_sys::Relation, attno: i32) -> key::Form {
    let attr = unsafe { &catalog::attributes((*relation).rd_att)[attno as usize - 1] };
    key::builtin_form(attr.atttypid, attr.atttypmod, attr.attcollation).unwrap_or_else(|| {
        key::require_form(&KeyColumn {
            name: format!(
                "{}.{}",
                catalog::relation_name(unsafe { (*relation).rd_id }),
                unsafe { CStr::from_ptr(attr.attname.data.as_ptr()) }.to_string_lossy()
            ),
            typoid: attr.atttypid,
            typmod: attr.atttypmod,
            collation: attr.attcollation,
        })
    })
}

/// The `(key_column, entity_type)` arguments of a trigger `protect` made with a key.
///
/// # Safety
/// `trigger` is a valid trigger of an open relation.
pub(super) unsafe fn key_arguments(trigger: &pg_sys::Trigger) -> Option<(&CStr, &CStr)> {
    (trigger.tgnargs == 2 && !trigger.tgargs.is_null()).then(|| unsafe {
        let args = catalog::slice(trigger.tgargs, 2);
        (CStr::from_ptr(args[0]), CStr::from_ptr(args[1]))
    })
}

/// Raises 40001 when the client's `app.directory_version` is unset or below `min_accepted`, or
/// when the entity it declared (`app.entity_type`, `app.entity_id`) is frozen, moved, or fenced
/// above the client's version. Holds a shared lock until commit so no fence slips in between.
/// PARALLEL UNSAFE: it reads the latest committed fences, which a parallel operation cannot.
#[pg_extern(volatile, parallel_unsafe)]
fn assert_directory_version() {
    check_request(Access::Write);
}

/// The check for a transaction that only reads (`reading`): as `assert_directory_version()`, but
/// an entity frozen for its cutover is let through, since its source still holds every row.
/// `reading = false` is the write check.
#[pg_extern(volatile, parallel_unsafe, name = "assert_directory_version")]
fn assert_directory_version_for(reading: Option<bool>) {
    let reading = required(reading, "reading");
    check_request(if reading { Access::Read } else { Access::Write });
}

/// The trigger's name, after checking it is `expected`: the functions are not PUBLIC, and a role
/// granted them still cannot attach them under another name, which `unprotect`,
/// `protected_tables()` and the mover would not see.
fn require_name(trigger: &PgTrigger<'_>, expected: &'static CStr, function: &'static str) {
    let data = trigger.trigger_data();
    let name = unsafe { CStr::from_ptr((*data.tg_trigger).tgname) };
    if name != expected {
        SdError::TriggerMisused {
            function,
            table: catalog::relation_name(unsafe { (*data.tg_relation).rd_id }),
        }
        .raise();
    }
}

/// The `(key_column, entity_type)` the table was protected with: the arguments of its row
/// trigger, or of the statement trigger of a partitioned table (which holds no rows).
fn row_protection(relation: pg_sys::Relation) -> Option<(String, String)> {
    unsafe {
        let desc = (*relation).trigdesc;
        if desc.is_null() {
            return None;
        }
        let triggers = catalog::slice((*desc).triggers, (*desc).numtriggers);
        triggers.iter().find_map(|t| {
            let name = CStr::from_ptr(t.tgname);
            ((name == ROW_TRIGGER || name == STATEMENT_TRIGGER)
                && t.tgnargs == 2
                && !t.tgargs.is_null())
            .then(|| {
                let args = catalog::slice(t.tgargs, 2);
                let arg = |i: usize| CStr::from_ptr(args[i]).to_string_lossy().into_owned();
                (arg(0), arg(1))
            })
        })
    }
}

/// Statement trigger installed by `protect(table)`: every INSERT, UPDATE, DELETE and TRUNCATE of
/// the table is checked as if the application had called `assert_directory_version()`. A
/// TRUNCATE is refused while an entity of the table's type is frozen or moved here: it would
/// wipe rows that a cutover is carrying, or that a stale client is being sent away from.
#[pg_trigger]
pub fn shard_directory_protect_statement<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    require_name(
        trigger,
        STATEMENT_TRIGGER,
        "shard_directory_protect_statement",
    );
    check_request(Access::Write);
    let data = trigger.trigger_data();
    if data.tg_event & pg_sys::TRIGGER_EVENT_OPMASK == pg_sys::TRIGGER_EVENT_TRUNCATE {
        if let Some((_, entity_type)) = row_protection(data.tg_relation) {
            if let Some((entity, fence)) = cached::frozen_or_moved(&entity_type) {
                refuse(SdError::TruncateFenced {
                    table: catalog::relation_name(unsafe { (*data.tg_relation).rd_id }),
                    entity,
                    fence,
                });
            }
        }
    }
    Ok(None)
}

/// Row trigger installed by `protect`: AFTER each row is written (so keys filled by BEFORE
/// triggers and generated columns are what it sees), the shard-wide rule (a write made straight to
/// a partition has no statement trigger of the parent's), then, when installed with
/// `(key_column, entity_type)`, the row's entity against its fence, old key and new. A refusal
/// aborts the statement before it can commit.
#[pg_trigger]
pub fn shard_directory_protect_row<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    require_name(trigger, ROW_TRIGGER, "shard_directory_protect_row");
    lock();
    let request = request();
    check_shard(request.version);
    let data = trigger.trigger_data();
    let Some((key_column, entity_type)) = (unsafe { key_arguments(&*data.tg_trigger) }) else {
        return Ok(None);
    };
    let attno = key_attno(data.tg_relation, key_column);
    let tupdesc = unsafe { (*data.tg_relation).rd_att };
    let entity_type = entity_type.to_string_lossy();
    let entity_type: &str = &entity_type;
    // The key's text is its type's output (so any supported key type works), read in the form
    // its equality compares (char(n) without its padding), borrowed: it lives in the trigger's
    // memory context, and the check allocates nothing unless it refuses.
    let form = key_form(data.tg_relation, attno);
    let id_of = |tuple: *mut pg_sys::HeapTupleData| -> Option<Cow<'_, str>> {
        if tuple.is_null() {
            return None;
        }
        let value = unsafe { pg_sys::SPI_getvalue(tuple, tupdesc, attno) };
        (!value.is_null()).then(|| {
            String::from_utf8_lossy(form.text(unsafe { CStr::from_ptr(value) }.to_bytes()))
        })
    };
    let fired_for_update =
        data.tg_event & pg_sys::TRIGGER_EVENT_OPMASK == pg_sys::TRIGGER_EVENT_UPDATE;
    let old = id_of(data.tg_trigtuple);
    let new = if fired_for_update {
        id_of(data.tg_newtuple).filter(|new| Some(new) != old.as_ref())
    } else {
        None
    };
    for entity_id in [&old, &new].into_iter().flatten() {
        check_row_entity(
            EntityRef {
                entity_type,
                entity_id,
            },
            request.version,
        );
    }
    Ok(None)
}
