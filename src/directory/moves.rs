//! The DBA's move steps as functions. Each locks the entry, checks the step against the state
//! machine (so the error names the step), then writes it with a plain UPDATE so the triggers
//! version, notify and record it like any other change. Each returns the new version.

use pgrx::prelude::*;

use super::transition::{self, EntityKey, Placement, State, Transition};
use super::version;
use crate::error::{required, spi, SdError};
use crate::{catalog, privilege};

fn lock_entry(key: &EntityKey, step: &'static str) -> Placement {
    let row = spi(
        "lock directory entry",
        Spi::connect_mut(|c| {
            let table = c.update(
                "SELECT state, shard_name, target_shard FROM shard_directory.shard_directory \
             WHERE entity_type = $1 AND entity_id = $2 FOR UPDATE",
                Some(1),
                &[
                    key.entity_type.as_str().into(),
                    key.entity_id.as_str().into(),
                ],
            )?;
            if table.is_empty() {
                return Ok::<_, pgrx::spi::SpiError>(None);
            }
            let row = table.first();
            Ok(Some((
                row.get::<String>(1)?.unwrap_or_default(),
                row.get::<String>(2)?.unwrap_or_default(),
                row.get::<String>(3)?,
            )))
        }),
    );
    let Some((state, shard_name, target_shard)) = row else {
        SdError::UnknownEntity {
            entity: key.clone(),
            step,
        }
        .raise()
    };
    Placement {
        state: transition::parse_state(key, &state).unwrap_or_else(|e| e.raise()),
        shard_name,
        target_shard,
    }
}

/// Checks `old -> new` is one of `expected`, then writes it.
fn step(
    key: EntityKey,
    step: &'static str,
    expected: &[Transition],
    new: impl FnOnce(&Placement) -> Placement,
) -> i64 {
    let old = lock_entry(&key, step);
    let new = new(&old);
    let refused = || SdError::InvalidTransition {
        entity: key.clone(),
        from: old.clone(),
        to: new.clone(),
        step: Some(step),
    };
    match transition::check_update(&key, &old, &new, false) {
        Ok(t) if expected.contains(&t) => {}
        _ => refused().raise(),
    }
    let version = spi(
        "write directory step",
        Spi::connect_mut(|c| {
            c.update(
                "UPDATE shard_directory.shard_directory \
             SET state = $3, shard_name = $4, target_shard = $5 \
             WHERE entity_type = $1 AND entity_id = $2",
                None,
                &[
                    key.entity_type.as_str().into(),
                    key.entity_id.as_str().into(),
                    new.state.as_str().into(),
                    new.shard_name.as_str().into(),
                    new.target_shard.as_deref().into(),
                ],
            )?;
            // The step returns its version: taken now, not at commit.
            version::settle();
            // Read back, not RETURNING: RETURNING shows the stamp the row was written with, and
            // the statement stamps it again when another writer took that version first.
            c.select(
                "SELECT version FROM shard_directory.shard_directory \
                 WHERE entity_type = $1 AND entity_id = $2",
                Some(1),
                &[
                    key.entity_type.as_str().into(),
                    key.entity_id.as_str().into(),
                ],
            )?
            .first()
            .get_one::<i64>()
        }),
    );
    version.unwrap_or_else(|| SdError::UnknownEntity { entity: key, step }.raise())
}

/// The directory's version; anyone may read it (clients poll it), whatever their grants. A read
/// (not `Spi::get_one`, which takes a transaction id): it also answers on a hot standby, and
/// writes no WAL.
#[pg_extern(volatile)]
fn current_version() -> i64 {
    let version = privilege::as_owner_of(catalog::relation(c"shard_directory_version"), || {
        spi(
            "read shard_directory_version",
            Spi::connect(|c| {
                c.select(
                    "SELECT version FROM shard_directory.shard_directory_version WHERE id",
                    Some(1),
                    &[],
                )?
                .first()
                .get_one::<i64>()
            }),
        )
    });
    version.unwrap_or_else(|| {
        SdError::SingletonMissing {
            table: "shard_directory_version",
        }
        .raise()
    })
}

/// active -> migrating towards `target_shard`: routers dual-read, writes stay on the source.
#[pg_extern(volatile)]
fn begin_move(
    entity_type: Option<&str>,
    entity_id: Option<&str>,
    target_shard: Option<&str>,
) -> i64 {
    let key = crate::entity::key_of(entity_type, entity_id);
    let target = required(target_shard, "target_shard");
    step(key, "begin_move", &[Transition::BeginMove], |old| {
        Placement {
            state: State::Migrating,
            shard_name: old.shard_name.clone(),
            target_shard: Some(target.to_owned()),
        }
    })
}

/// migrating -> read_only before the cutover; active -> read_only is a maintenance freeze.
#[pg_extern(volatile)]
fn freeze(entity_type: Option<&str>, entity_id: Option<&str>) -> i64 {
    step(
        crate::entity::key_of(entity_type, entity_id),
        "freeze",
        &[Transition::Freeze, Transition::MaintenanceFreeze],
        |old| Placement {
            state: State::ReadOnly,
            ..old.clone()
        },
    )
}

/// read_only -> active at the target: the cutover.
#[pg_extern(volatile)]
fn complete_move(entity_type: Option<&str>, entity_id: Option<&str>) -> i64 {
    step(
        crate::entity::key_of(entity_type, entity_id),
        "complete_move",
        &[Transition::Cutover],
        |old| Placement {
            state: State::Active,
            shard_name: old
                .target_shard
                .clone()
                .unwrap_or_else(|| old.shard_name.clone()),
            target_shard: None,
        },
    )
}

/// migrating or read_only -> active at the source.
#[pg_extern(volatile)]
fn abort_move(entity_type: Option<&str>, entity_id: Option<&str>) -> i64 {
    step(
        crate::entity::key_of(entity_type, entity_id),
        "abort_move",
        &[Transition::Abort],
        |old| Placement {
            state: State::Active,
            shard_name: old.shard_name.clone(),
            target_shard: None,
        },
    )
}

/// Releases the entity from a freeze whose lease has ended before its cutover: the entry goes back
/// to active on its source (`abort_move`), and its move to `aborting`, for the mover's next run to
/// clean up. A move already `aborting` whose entry is still read-only (an earlier mover released
/// its shards first, and stopped before the directory) is released the same way. Returns the new version, or NULL when there is nothing to release (no open move of
/// the entity is frozen, or its lease has not ended on this server's clock). Routers call it when
/// they find an entity read-only for long, so that a mover that vanished mid-freeze does not
/// leave its entity frozen for good; the shards' fences end the same lease themselves. It runs
/// as the owner of the extension's tables, so a role granted EXECUTE needs nothing else.
#[pg_extern(volatile)]
fn release_expired_freeze(entity_type: Option<&str>, entity_id: Option<&str>) -> Option<i64> {
    let key = crate::entity::key_of(entity_type, entity_id);
    privilege::as_owner_of(catalog::relation(c"shard_moves"), || {
        // The move's row first, as the mover's cutover locks it: one of the two waits for the
        // other, and the second finds the first's phase.
        let expired = spi(
            "find an expired freeze",
            Spi::connect_mut(|c| {
                let found = c.update(
                    "SELECT m.move_id FROM shard_directory.shard_moves m \
                     JOIN shard_directory.shard_directory d USING (entity_type, entity_id) \
                     WHERE m.entity_type = $1 AND m.entity_id = $2 AND m.finished_at IS NULL \
                       AND m.phase IN ('frozen', 'verified', 'aborting') \
                       AND d.state = 'read_only' AND m.freeze_lease_until < clock_timestamp() \
                     FOR UPDATE OF m",
                    Some(1),
                    &[
                        key.entity_type.as_str().into(),
                        key.entity_id.as_str().into(),
                    ],
                )?;
                if found.is_empty() {
                    return Ok::<_, pgrx::spi::SpiError>(None);
                }
                found.first().get_one::<i64>()
            }),
        )?;
        let version = abort_move(entity_type, entity_id);
        spi(
            "record the released freeze",
            Spi::run_with_args(
                "UPDATE shard_directory.shard_moves SET phase = 'aborting', updated_at = now(), \
                 last_error = format('the freeze''s lease ended at %s before the cutover: the entity \
                                      was released on its source', freeze_lease_until) \
                 WHERE move_id = $1",
                &[expired.into()],
            ),
        );
        Some(version)
    })
}
