//! The native triggers on the directory's tables. Each one is thin: the rules are in
//! `transition`, the version in `version`, history in `history`. Each refuses to run on any
//! table but its own.

#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::CStr;

use pgrx::prelude::*;

use super::row::{self, Entry};
use super::transition::{self, Transition};
use super::writer::{self, Writer};
use super::{heap, history, notify, registry, replica, version};
use crate::error::{spi, SdError};
use crate::{catalog, guc, privilege, TriggerResult};

fn op(trigger: &PgTrigger<'_>) -> PgTriggerOperation {
    spi("trigger operation", trigger.op())
}

/// The trigger's table, after checking it is `table`.
fn own_table(trigger: &PgTrigger<'_>, function: &'static str, table: &'static CStr) -> pg_sys::Oid {
    let relation = trigger.trigger_data().tg_relation;
    catalog::require_own_table(relation, function, table);
    // SAFETY: the trigger's relation, open while it runs.
    unsafe { (*relation).rd_id }
}

/// The `version` of `row`, a row of the trigger's table (0 when NULL or no row).
fn version_of(trigger: &PgTrigger<'_>, row: Option<pg_sys::HeapTuple>) -> i64 {
    let Some(row) = row else { return 0 };
    let desc = desc(trigger);
    let [at] = row::positions(desc, [c"version"]);
    let mut is_null = false;
    // SAFETY: `row` is one of the trigger's rows, which `desc` describes.
    let datum = unsafe { pg_sys::heap_getattr(row, at as i32, desc, &mut is_null) };
    // SAFETY: `positions` checked the column is a bigint, passed by value.
    unsafe { i64::from_datum(datum, is_null) }.unwrap_or(0)
}

/// The row as it was and as it is written, as PostgreSQL hands them to a row trigger (none to a
/// statement trigger).
fn rows(trigger: &PgTrigger<'_>) -> (Option<pg_sys::HeapTuple>, Option<pg_sys::HeapTuple>) {
    let data = trigger.trigger_data();
    let row = |t: pg_sys::HeapTuple| (!t.is_null()).then_some(t);
    match op(trigger) {
        PgTriggerOperation::Insert => (None, row(data.tg_trigtuple)),
        PgTriggerOperation::Update => (row(data.tg_trigtuple), row(data.tg_newtuple)),
        PgTriggerOperation::Delete => (row(data.tg_trigtuple), None),
        PgTriggerOperation::Truncate => (None, None),
    }
}

/// The descriptor of the trigger's table.
fn desc(trigger: &PgTrigger<'_>) -> pg_sys::TupleDesc {
    // SAFETY: the trigger's relation, open while it runs.
    unsafe { (*trigger.trigger_data().tg_relation).rd_att }
}

/// The transition a row change makes, or the error that refuses it. Called before the write
/// (to fail early) and after it (so that another BEFORE trigger cannot slip an unchecked change in).
fn classify(
    trigger: &PgTrigger<'_>,
) -> Result<(Option<Entry>, Option<Entry>, Transition), SdError> {
    let (old, new) = rows(trigger);
    // SAFETY: the trigger's rows, described by its relation's descriptor, valid for the call.
    let read = |t| unsafe { Entry::read(t, desc(trigger)) };
    let (old, new) = (old.map(read), new.map(read));
    let transition = match (&old, &new) {
        (None, Some(n)) => transition::check_insert(&n.key, &n.placement)?,
        (Some(o), None) => transition::check_delete(&o.key, &o.placement)?,
        (Some(o), Some(n)) => {
            if o.key != n.key {
                return Err(SdError::KeyChange {
                    from: o.key.clone(),
                    to: n.key.clone(),
                });
            }
            transition::check_update(&n.key, &o.placement, &n.placement, guc::ALLOW_REPOINT.get())?
        }
        (None, None) => {
            return Err(SdError::TriggerMisused {
                function: "shard_directory_guard",
                table: "a statement-level trigger".into(),
            })
        }
    };
    Ok((old, new, transition))
}

/// An update that leaves shard, state, target and region as they were changes nothing.
fn unchanged(old: &Option<Entry>, new: &Option<Entry>) -> bool {
    matches!((old, new), (Some(o), Some(n)) if o.placement == n.placement && o.region == n.region)
}

/// BEFORE STATEMENT: opens the statement's version frame.
#[pg_trigger]
fn shard_directory_statement_begin<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    own_table(
        trigger,
        "shard_directory_statement_begin",
        c"shard_directory",
    );
    version::begin(trigger.trigger_data().tg_relation);
    Ok(None)
}

/// An entry inserted with its version already stamped by the table's owner is a restore (a
/// `pg_dump` being loaded): it is kept as it was, and the global version rises to cover it. Its
/// shards are taken as the dump had them: a parallel restore may load them after it.
fn restore(new: &Entry, version: i64) {
    if let Err(e) = transition::check_restore(&new.key, &new.placement) {
        e.raise()
    }
    version::raise_to(version, None, None);
}

/// BEFORE ROW: the state machine, the shard registry and region rule, then the version stamp and
/// who/when, which no writer can forge.
#[pg_trigger]
fn shard_directory_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let relid = own_table(trigger, "shard_directory_guard", c"shard_directory");
    replica::refuse_replica_role("shard_directory");
    if let (PgTriggerOperation::Insert, (_, Some(row))) = (op(trigger), rows(trigger)) {
        let version = version_of(trigger, Some(row));
        if version > 0 && privilege::current_role_owns(relid) {
            // SAFETY: the trigger's row, described by its relation's descriptor.
            restore(&unsafe { Entry::read(row, desc(trigger)) }, version);
            return Ok(trigger.new().map(PgHeapTuple::into_owned));
        }
    }
    let (old, new, _) = classify(trigger).unwrap_or_else(|e| e.raise());
    if unchanged(&old, &new) {
        // Keep the stored row as it is: nothing to version, nothing to record.
        return Ok(trigger.old().map(PgHeapTuple::into_owned));
    }
    let stamp = version::stamp();
    let (Some(new), Some(tuple)) = (new, trigger.new()) else {
        return Ok(trigger.old().map(PgHeapTuple::into_owned));
    };
    let placement_changed = old
        .as_ref()
        .is_none_or(|o| o.placement != new.placement || o.region != new.region);
    if placement_changed {
        registry::check(&new).unwrap_or_else(|e| e.raise());
    }
    let [version, updated_at, updated_by] =
        row::positions(desc(trigger), [c"version", c"updated_at", c"updated_by"]);
    let stamps = [
        (version, stamp.into_datum()),
        (updated_at, history::transaction_start().into_datum()),
        (
            updated_by,
            privilege::role_name(privilege::current_role()).into_datum(),
        ),
    ];
    // SAFETY: the trigger's tuple and its relation's descriptor, valid for the call; the stamped
    // copy is palloc'd in the trigger's context, as the executor expects a returned row to be.
    // One copy with three columns replaced: pgrx's `set_by_index` forms a new tuple per column.
    Ok(Some(unsafe {
        let desc = (*trigger.trigger_data().tg_relation).rd_att;
        let stamped = heap::modified(tuple.into_pg(), desc, &stamps);
        PgHeapTuple::from_heap_tuple(pgrx::PgTupleDesc::from_pg_unchecked(desc), stamped)
            .into_owned()
    }))
}

/// AFTER ROW: one history row per changed entry, with the transition it made, and where the
/// entry was written: both wait for the statement's version (`statement`).
#[pg_trigger]
fn shard_directory_record_history<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    own_table(
        trigger,
        "shard_directory_record_history",
        c"shard_directory",
    );
    let operation = op(trigger);
    if let (PgTriggerOperation::Insert, (_, Some(row))) = (&operation, rows(trigger)) {
        // An insert the statement did not stamp is a restored entry: its history is restored too.
        if !version::stamped_with(version_of(trigger, Some(row))) {
            return Ok(None);
        }
    }
    let (old, new, transition) = classify(trigger).unwrap_or_else(|e| e.raise());
    if unchanged(&old, &new) {
        return Ok(None);
    }
    let (_, written) = rows(trigger);
    // SAFETY: the trigger's row is valid for the call; its t_self is where it was written.
    let row = written.map(|row| (unsafe { (*row).t_self }, version_of(trigger, Some(row))));
    version::record(
        row,
        history::Change {
            old,
            new,
            transition,
            changed_by: privilege::role_name(privilege::current_role()),
        },
    );
    Ok(None)
}

/// AFTER STATEMENT (the guide's `shard_directory_changed`): notify the new version, if any.
#[pg_trigger]
fn notify_directory_change<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    own_table(trigger, "notify_directory_change", c"shard_directory");
    version::end();
    Ok(None)
}

/// AFTER INSERT OR UPDATE OF phase on `shard_moves`: each move's new phase to the listeners of
/// `shard_directory_moves`, at commit, so tools follow moves without polling.
#[pg_trigger]
fn shard_moves_notify<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    own_table(trigger, "shard_moves_notify", c"shard_moves");
    let new = trigger.new().expect("fired for INSERT or UPDATE");
    let text = |row: &PgHeapTuple<'_, AllocatedByPostgres>, column: &str| -> String {
        spi("read a move", row.get_by_name::<String>(column)).unwrap_or_default()
    };
    let phase = text(&new, "phase");
    if trigger
        .old()
        .is_some_and(|old| text(&old, "phase") == phase)
    {
        return Ok(None);
    }
    let move_id = spi("read a move", new.get_by_name::<i64>("move_id")).unwrap_or_default();
    notify::move_phase(
        move_id,
        (&text(&new, "entity_type"), &text(&new, "entity_id")),
        (&text(&new, "source_shard"), &text(&new, "target_shard")),
        &phase,
    );
    Ok(None)
}

/// BEFORE TRUNCATE on the extension's tables: a truncate would bypass versioning and history
/// (directory) or drop every fence at once (shard).
#[pg_trigger]
fn shard_directory_refuse_truncate<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    // SAFETY: the trigger's relation, open while it runs; the catalog lookups take plain values
    // and a NUL-terminated name.
    let (relid, schema, namespace) = unsafe {
        let relid = (*trigger.trigger_data().tg_relation).rd_id;
        (
            relid,
            pg_sys::get_namespace_oid(c"shard_directory".as_ptr(), true),
            pg_sys::get_rel_namespace(relid),
        )
    };
    let table = catalog::relation_name(relid);
    if namespace != schema {
        SdError::TriggerMisused {
            function: "shard_directory_refuse_truncate",
            table,
        }
        .raise();
    }
    SdError::TruncateRefused { table }.raise()
}

/// BEFORE ROW on `shard_directory_version`: one row, moving forward by exactly one bump. The
/// table's owner restoring a dump raises it to the restored value (never lowers it).
#[pg_trigger]
fn shard_directory_version_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let relid = own_table(
        trigger,
        "shard_directory_version_guard",
        c"shard_directory_version",
    );
    replica::refuse_replica_role("shard_directory_version");
    match op(trigger) {
        PgTriggerOperation::Update => {
            // Any update of the row (a DBA's by hand too) is ordered with the bumps.
            version::lock_versions();
            let (old, new) = rows(trigger);
            let (from, to) = (version_of(trigger, old), version_of(trigger, new));
            let allowed = to == from + 1 || (writer::writing(Writer::Restore) && to >= from);
            if !allowed {
                SdError::VersionRegression { from, to }.raise();
            }
            Ok(trigger.new().map(PgHeapTuple::into_owned))
        }
        PgTriggerOperation::Insert if privilege::current_role_owns(relid) => {
            let new = trigger.new();
            version::raise_to(
                version_of(trigger, rows(trigger).1),
                new.as_ref()
                    .and_then(|t| spi("updated_at", t.get_by_name("updated_at"))),
                new.as_ref()
                    .and_then(|t| t.get_by_name::<String>("lineage").ok().flatten()),
            );
            Ok(None)
        }
        PgTriggerOperation::Insert => SdError::VersionRowFixed { op: "INSERT" }.raise(),
        _ => SdError::VersionRowFixed { op: "DELETE" }.raise(),
    }
}

/// BEFORE ROW on `shard_directory_history`: only the table's owner inserts (the history trigger
/// acting for a writer, or a restore), only `purge_history` deletes, nothing updates.
#[pg_trigger]
fn shard_directory_history_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let relid = own_table(
        trigger,
        "shard_directory_history_guard",
        c"shard_directory_history",
    );
    replica::refuse_replica_role("shard_directory_history");
    let (allowed, name) = match op(trigger) {
        PgTriggerOperation::Insert => (privilege::current_role_owns(relid), "INSERT"),
        PgTriggerOperation::Delete => (writer::writing(Writer::Purge), "DELETE"),
        _ => (false, "UPDATE"),
    };
    if !allowed {
        SdError::HistoryAppendOnly { op: name }.raise();
    }
    Ok(trigger
        .new()
        .or_else(|| trigger.old())
        .map(PgHeapTuple::into_owned))
}

/// BEFORE UPDATE or DELETE on `shards`: a shard stays registered, under its name, while an
/// entry or an open move names it; its new region must still hold every entry placed on it (or
/// moving to it) that has a region of its own (`registry`).
#[pg_trigger]
fn shards_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    own_table(trigger, "shards_guard", c"shards");
    let column = |t: Option<PgHeapTuple<'a, pgrx::AllocatedByPostgres>>, name: &str| {
        t.and_then(|t| spi("read shards", t.get_by_name::<String>(name)))
    };
    let shard = column(trigger.old(), "shard_name").unwrap_or_default();
    let new_name = column(trigger.new(), "shard_name");
    if new_name.as_ref() != Some(&shard) {
        // Removed or renamed. Entries being written on this shard hold it shared until they
        // commit: waits for them, then reads what names it as committed.
        registry::hold(&shard, true);
        if let Some(user) = registry::user(&shard) {
            SdError::ShardInUse { shard, user }.raise();
        }
    }
    let new_region = column(trigger.new(), "region");
    if let (Some(new_region), Some(shard)) = (new_region, new_name) {
        if Some(&new_region) != column(trigger.old(), "region").as_ref() {
            registry::hold(&shard, true);
            if let Some((entity, entity_region)) = registry::misplaced(&shard, &new_region) {
                SdError::RegionMismatch {
                    entity,
                    entity_region,
                    shard,
                    shard_region: new_region,
                }
                .raise();
            }
        }
    }
    Ok(trigger
        .new()
        .or_else(|| trigger.old())
        .map(PgHeapTuple::into_owned))
}
