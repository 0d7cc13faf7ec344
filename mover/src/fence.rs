//! An entity's fence on one shard, read and written through the extension's functions. A move
//! records both sides' fences before it changes them, so that an abort can put them back.

use serde::{Deserialize, Serialize};
use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::patience::Patience;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Fence {
    /// No fence: `min_accepted` alone governs the entity on this shard.
    None,
    Owned {
        min_version: i64,
    },
    Frozen,
    Moved {
        moved_to: String,
        version: i64,
    },
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fence::None => f.write_str("no fence"),
            Fence::Owned { min_version } => write!(f, "owned (min_version {min_version})"),
            Fence::Frozen => f.write_str("frozen"),
            Fence::Moved { moved_to, version } => {
                write!(f, "moved to {moved_to} at version {version}")
            }
        }
    }
}

pub(crate) async fn read(client: &Client, key: &EntityKey) -> Result<Fence, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT state, min_version, moved_to FROM shard_directory.shard_fences \
             WHERE entity_type = $1 AND entity_id = $2",
            &[&key.entity_type, &key.entity_id],
        )
        .await?;
    Ok(match row {
        None => Fence::None,
        Some(r) => match r.get::<_, &str>(0) {
            "frozen" => Fence::Frozen,
            "moved" => Fence::Moved {
                moved_to: r.get(2),
                version: r.get(1),
            },
            _ => Fence::Owned {
                min_version: r.get(1),
            },
        },
    })
}

/// Makes the entity's fence `fence`. Fencing waits for the entity's checked transactions in
/// flight; once it returns, no checked write of the entity commits here against the old fence.
pub(crate) async fn set(
    client: &Client,
    key: &EntityKey,
    fence: &Fence,
) -> Result<(), tokio_postgres::Error> {
    let (t, id) = (&key.entity_type, &key.entity_id);
    match fence {
        Fence::None => {
            client
                .execute("SELECT shard_directory.unfence($1, $2)", &[t, id])
                .await
        }
        Fence::Owned { min_version } => {
            client
                .execute(
                    "SELECT shard_directory.fence_owned($1, $2, $3)",
                    &[t, id, min_version],
                )
                .await
        }
        Fence::Frozen => {
            client
                .execute("SELECT shard_directory.fence_frozen($1, $2)", &[t, id])
                .await
        }
        Fence::Moved { moved_to, version } => {
            client
                .execute(
                    "SELECT shard_directory.fence_moved($1, $2, $3, $4)",
                    &[t, id, moved_to, version],
                )
                .await
        }
    }
    .map(|_| ())
}

/// The entity frozen on the source for `lease` only, counted on the shard's clock from when the
/// fence takes effect: past it the shard admits only clients whose directory version is above
/// `freeze_version` (`fence_frozen(.., lease, freeze_version)`), so a mover that vanished does not
/// leave the entity frozen for good.
pub(crate) async fn freeze_leased(
    client: &Client,
    key: &EntityKey,
    lease: std::time::Duration,
    freeze_version: i64,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "SELECT shard_directory.fence_frozen($1, $2, make_interval(secs => $3), $4)",
            &[
                &key.entity_type,
                &key.entity_id,
                &lease.as_secs_f64(),
                &freeze_version,
            ],
        )
        .await
        .map(|_| ())
}

/// The checked transactions idle on the shard (or open for over a second), named (pid, state,
/// since), if any: a fence waits for every checked transaction in flight, so one left open holds
/// it. (A role that may not see other roles' sessions' state sees only the long ones.)
pub(crate) async fn lingering_checks(
    client: &Client,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT string_agg(format('pid %s (%s, since %s)', a.pid, coalesce(a.state, '?'), \
                                      to_char(a.xact_start AT TIME ZONE 'UTC', 'HH24:MI:SS')), \
                               ', ' ORDER BY a.xact_start) \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'relation' AND l.granted AND l.mode = 'RowShareLock' \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.relation = 'shard_directory.shard_settings'::regclass \
               AND l.pid <> pg_backend_pid() \
               AND (a.state LIKE 'idle in transaction%' \
                    OR a.xact_start < clock_timestamp() - interval '1 second')",
            &[],
        )
        .await?
        .get(0))
}

/// Runs a fence change until it commits, or until `patience` has passed: a fence waits for the
/// shard's checked transactions in flight, and gives up (55P03) after
/// `shard_directory.fence_wait_timeout` behind one that stays open. Each retry waits a little
/// longer (100 ms, doubling, at most 2 s). Other errors are returned at once.
pub(crate) async fn patiently<F, Fut>(
    patience: std::time::Duration,
    mut change: F,
) -> Result<(), tokio_postgres::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tokio_postgres::Error>>,
{
    let mut patience = Patience::new(patience);
    loop {
        match change().await {
            // Not past the patience: the caller's lock timeout comes on top of the pause.
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
                    && patience.fits() =>
            {
                tracing::info!(error = %e, "a fence change waited for checked transactions; retrying");
                patience.pause().await;
            }
            other => return other,
        }
    }
}

/// Lets this transaction's writes of the entity's rows through its fence (the extension's
/// `bypass_fence`, not executable by PUBLIC), stamped with directory version `version` for the
/// shard-wide check. The mover's copies in and deletes out go through here, never around the
/// triggers.
pub(crate) async fn bypass(
    tx: &tokio_postgres::Transaction<'_>,
    key: &EntityKey,
    version: i64,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "SELECT shard_directory.bypass_fence($1, $2), \
                set_config('app.directory_version', $3, true)",
        &[&key.entity_type, &key.entity_id, &version.to_string()],
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_recorded_as_tagged_json() {
        let moved = Fence::Moved {
            moved_to: "shard_2".into(),
            version: 8,
        };
        let json = serde_json::to_string(&moved).unwrap();
        assert_eq!(
            json,
            r#"{"state":"moved","moved_to":"shard_2","version":8}"#
        );
        assert_eq!(serde_json::from_str::<Fence>(&json).unwrap(), moved);
        assert_eq!(
            serde_json::to_string(&Fence::None).unwrap(),
            r#"{"state":"none"}"#
        );
    }
}
