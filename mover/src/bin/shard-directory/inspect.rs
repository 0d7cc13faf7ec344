//! What the directory and the move records say: `status`, `list`, `where`, `history`.

use serde_json::json;
use shard_directory_mover::Mover;
use shard_directory_protocol::EntityKey;

use crate::moves::summary;
use crate::output::{lines, Outcome, Print};

/// `status`: one move, with who drives it and what its slot keeps; or the open moves.
pub async fn status(mover: &Mover, print: Print, move_id: Option<i64>) -> Result<(), Outcome> {
    let Some(id) = move_id else {
        let records = mover.list(true, None).await?;
        print.result(&records, |records| {
            if records.is_empty() {
                "no open moves".to_owned()
            } else {
                lines(records.iter().map(|r| summary(r, None)))
            }
        });
        return Ok(());
    };
    let status = mover.status_detail(id).await?;
    print.result(&status, |status| {
        let streaming = status.slot.as_ref().map(|s| s.active);
        let mut out = summary(&status.record, streaming);
        if let Some(d) = &status.driver {
            out.push_str(&format!("\n  driven by {d}"));
        }
        if let Some(s) = &status.slot {
            out.push_str(&format!(
                "\n  slot {} on {} keeps {} bytes of WAL ({}, {})",
                s.name,
                s.shard,
                s.retained_wal_bytes,
                s.wal_status.as_deref().unwrap_or("?"),
                if s.active {
                    "streaming"
                } else {
                    "not streaming"
                }
            ));
        }
        if let Some(value) = &status.way_back_stopped_by {
            let r = &status.record;
            out.push_str(&format!(
                "\n  the way back stopped at a value {} cannot read: {value}; the way back \
                 carries every change in order, so the tenant cannot go back to {}: \
                 `finalize {}` keeps it on {}",
                r.source_shard, r.source_shard, r.move_id, r.target_shard
            ));
        }
        out
    });
    Ok(())
}

/// `list`: every move (or the open ones, or those since a time), newest first.
pub async fn list(
    mover: &Mover,
    print: Print,
    open: bool,
    since: Option<&str>,
) -> Result<(), Outcome> {
    let records = mover.list(open, since).await?;
    print.each(&records, |r| {
        format!(
            "{:>6}  {:<11}  {}  {} -> {}  {}  started {} by {}",
            r.move_id,
            r.phase,
            r.entity(),
            r.source_shard,
            r.target_shard,
            r.method.as_str(),
            r.started_at,
            r.started_by
        )
    });
    Ok(())
}

/// `where`: the shard that holds `key` now (its entry), or held it at a time.
pub async fn where_is(
    mover: &Mover,
    print: Print,
    key: &EntityKey,
    at: Option<&str>,
) -> Result<(), Outcome> {
    if let Some(at) = at {
        let shard = mover.placement_at(key, at).await?;
        let found = json!({"entity_type": key.entity_type, "entity_id": key.entity_id,
                           "at": at, "shard": shard});
        print.result(&found, |_| match &shard {
            Some(shard) => format!("{key} at {at}: {shard}"),
            None => format!("{key} at {at}: did not exist"),
        });
        return Ok(());
    }
    let Some(placement) = mover.placement(key).await? else {
        return Err(Outcome::Failed(1, format!("no directory entry for {key}")));
    };
    print.result(&placement, |p| {
        format!(
            "{key}: {} ({}{}, version {})",
            p.shard_name,
            p.state,
            p.target_shard
                .as_ref()
                .map(|t| format!(" to {t}"))
                .unwrap_or_default(),
            p.version
        )
    });
    Ok(())
}

/// `history`: every change of `key`'s directory entry.
pub async fn history(mover: &Mover, print: Print, key: &EntityKey) -> Result<(), Outcome> {
    let rows = mover.history(key).await?;
    print.each(&rows, |h| {
        format!(
            "{}  v{:<6} {:<18} {} -> {} ({}{})  by {}",
            h.changed_at,
            h.version,
            h.transition,
            h.old_shard.as_deref().unwrap_or("-"),
            h.new_shard.as_deref().unwrap_or("-"),
            h.new_state.as_deref().unwrap_or("deleted"),
            h.new_target
                .as_deref()
                .map(|t| format!(" to {t}"))
                .unwrap_or_default(),
            h.changed_by
        )
    });
    Ok(())
}
