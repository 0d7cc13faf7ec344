//! The native triggers on the directory's tables. Each one is thin: the rules are in
//! `transition`, the version in `statement`, history in `history`.

use pgrx::prelude::*;

use super::row::Entry;
use super::transition::{self, Transition};
use super::{history, statement};
use crate::error::SdError;
use crate::guc;
use crate::TriggerResult;

fn now() -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(unsafe { pg_sys::GetCurrentTransactionStartTimestamp() })
        .expect("transaction start is a valid timestamp")
}

fn current_user() -> String {
    unsafe {
        let name = pg_sys::GetUserNameFromId(pg_sys::GetUserId(), false);
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

fn op(trigger: &PgTrigger<'_>) -> PgTriggerOperation {
    trigger.op().expect("trigger operation")
}

/// The transition a row change makes, or the error that refuses it. Called before the write
/// (to fail early) and after it (so that another BEFORE trigger cannot slip an unchecked change in).
fn classify(
    trigger: &PgTrigger<'_>,
) -> Result<(Option<Entry>, Option<Entry>, Transition), SdError> {
    let old = trigger.old().map(|t| Entry::read(&t));
    let new = trigger.new().map(|t| Entry::read(&t));
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
        (None, None) => unreachable!("row trigger without a row"),
    };
    Ok((old, new, transition))
}

/// BEFORE STATEMENT: opens the statement's version frame.
#[pg_trigger]
fn shard_directory_statement_begin<'a>(_trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    statement::begin();
    Ok(None)
}

/// BEFORE ROW: the state machine, the shard registry and region rule, then the version stamp and
/// who/when, which no writer can forge.
#[pg_trigger]
fn shard_directory_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let (old, new, _) = classify(trigger).unwrap_or_else(|e| e.raise());
    let version = statement::current();
    let Some(new) = new else {
        return Ok(trigger.old().map(PgHeapTuple::into_owned));
    };
    let placement_changed = old
        .as_ref()
        .is_none_or(|o| o.placement != new.placement || o.region != new.region);
    if placement_changed {
        new.check_shards().unwrap_or_else(|e| e.raise());
    }
    let mut tuple = trigger.new().expect("row trigger has NEW").into_owned();
    tuple.set_by_name("version", version)?;
    tuple.set_by_name("updated_at", now())?;
    tuple.set_by_name("updated_by", current_user())?;
    Ok(Some(tuple))
}

/// AFTER ROW: one history row per changed entry, with the transition it made.
#[pg_trigger]
fn shard_directory_record_history<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let (old, new, transition) = classify(trigger).unwrap_or_else(|e| e.raise());
    let version = match &new {
        Some(_) => trigger
            .new()
            .and_then(|t| t.get_by_name::<i64>("version").ok().flatten())
            .expect("stamped version"),
        None => statement::current(),
    };
    history::record(old.as_ref(), new.as_ref(), transition, version);
    Ok(None)
}

/// AFTER STATEMENT (the guide's `shard_directory_changed`): notify the new version, if any.
#[pg_trigger]
fn notify_directory_change<'a>(_trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    if let Some(version) = statement::end() {
        statement::notify(version);
    }
    Ok(None)
}

/// BEFORE TRUNCATE on the directory's tables: a truncate would bypass versioning and history.
#[pg_trigger]
fn shard_directory_refuse_truncate<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let table = trigger.table_name().unwrap_or_default();
    SdError::TruncateRefused {
        table: format!("shard_directory.{table}"),
    }
    .raise()
}

/// BEFORE ROW on `shard_directory_version`: one row, only moving forward.
#[pg_trigger]
fn shard_directory_version_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let version = |t: Option<PgHeapTuple<'a, _>>| {
        t.and_then(|t| t.get_by_name::<i64>("version").ok().flatten())
            .unwrap_or(i64::MIN)
    };
    match op(trigger) {
        PgTriggerOperation::Update => {
            let (from, to) = (version(trigger.old()), version(trigger.new()));
            if to <= from {
                SdError::VersionRegression { from, to }.raise();
            }
            Ok(trigger.new().map(PgHeapTuple::into_owned))
        }
        PgTriggerOperation::Insert => SdError::VersionRowFixed { op: "INSERT" }.raise(),
        _ => SdError::VersionRowFixed { op: "DELETE" }.raise(),
    }
}

/// BEFORE ROW on `shard_directory_history`: only the history trigger inserts, only
/// `purge_history` deletes, nothing updates.
#[pg_trigger]
fn shard_directory_history_guard<'a>(trigger: &'a PgTrigger<'a>) -> TriggerResult<'a> {
    let allowed = match op(trigger) {
        PgTriggerOperation::Insert => history::writing(history::Writer::Recorder),
        PgTriggerOperation::Delete => history::writing(history::Writer::Purge),
        _ => false,
    };
    if !allowed {
        let op = match op(trigger) {
            PgTriggerOperation::Insert => "INSERT",
            PgTriggerOperation::Delete => "DELETE",
            _ => "UPDATE",
        };
        SdError::HistoryAppendOnly { op }.raise();
    }
    Ok(trigger
        .new()
        .or_else(|| trigger.old())
        .map(PgHeapTuple::into_owned))
}
