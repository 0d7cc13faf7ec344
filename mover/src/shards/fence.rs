//! An entity's fence on one shard, read and written through the extension's functions. A move
//! records both sides' fences before it changes them, so that an abort can put them back.

use serde::{Deserialize, Serialize};
use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::patience::{Retry, Verdict, Wait};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Fence {
    /// No fence: `min_accepted` alone governs the entity on this shard.
    None,
    Owned {
        min_version: i64,
    },
    Frozen,
    /// Its cutover is being committed: reads are refused too (`fence_cutover`, with a lease).
    Cutover,
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
            Fence::Cutover => f.write_str("cutover (reads refused too)"),
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
            "cutover" => Fence::Cutover,
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

/// `SELECT shard_directory.<call>`, its lock waits bounded as its wait for checked transactions
/// is (`shard_directory.fence_wait_timeout`): a fence change queued behind a table lock (a
/// maintenance `REINDEX`, say) gives up with 55P03 too, and is tried again by [`patiently`].
fn bounded(call: &str) -> String {
    format!(
        "SELECT set_config('lock_timeout', \
                coalesce(current_setting('shard_directory.fence_wait_timeout', true), '2s'), true), \
                shard_directory.{call}"
    )
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
        Fence::None => client.execute(&bounded("unfence($1, $2)"), &[t, id]).await,
        Fence::Owned { min_version } => {
            client
                .execute(&bounded("fence_owned($1, $2, $3)"), &[t, id, min_version])
                .await
        }
        // A cutover fence is only ever set with its lease (`cutover`); put back, it is frozen.
        Fence::Frozen | Fence::Cutover => {
            client
                .execute(&bounded("fence_frozen($1, $2)"), &[t, id])
                .await
        }
        Fence::Moved { moved_to, version } => {
            client
                .execute(
                    &bounded("fence_moved($1, $2, $3, $4)"),
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
            &bounded("fence_frozen($1, $2, make_interval(secs => $3), $4)"),
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

/// The source's fence for the cutover (`fence_cutover`): reads refused too, for `lease`, then
/// clients at `cutover_version` and above only. Set while the directory holds its version lock
/// for the cutover, so it waits at most `wait` for the shard's checked transactions in flight or
/// a lock (55P03 past it, and the cutover is tried again), and runs no longer than three times
/// that (a silent network is the caller's to bound).
pub(crate) async fn cutover(
    client: &mut Client,
    key: &EntityKey,
    lease: std::time::Duration,
    cutover_version: i64,
    wait: std::time::Duration,
) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    // A statement that waited `wait` for one lock gives up with 55P03 (tried again); one that
    // runs on past three times that is cancelled (57014, and the move is undone).
    let (wait, limit) = (
        format!("{}ms", wait.as_millis().max(1)),
        format!("{}ms", (wait * 3).as_millis().max(1)),
    );
    tx.execute(
        "SELECT set_config('shard_directory.fence_wait_timeout', $1, true), \
                set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)",
        &[&wait, &limit],
    )
    .await?;
    tx.execute(
        "SELECT shard_directory.fence_cutover($1, $2, make_interval(secs => $3), $4)",
        &[
            &key.entity_type,
            &key.entity_id,
            &lease.as_secs_f64(),
            &cutover_version,
        ],
    )
    .await?;
    tx.commit().await
}

/// The checked transactions left open on the shard, named (pid, state, since), if any: idle in
/// the transaction for over a quarter of a second, or open for over a second. A fence waits for
/// every checked transaction in flight, so one left open holds it. Not every one idle at the
/// sample: a busy application's short transactions are each idle for a moment between
/// statements, and some one of them nearly always is. (Other roles' sessions are seen with
/// `pg_read_all_stats` only.)
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
               AND (a.xact_start < clock_timestamp() - interval '1 second' \
                    OR (a.state LIKE 'idle in transaction%' \
                        AND a.state_change < clock_timestamp() - interval '250 milliseconds'))",
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
    // From the call, whole pauses only: the change's own lock wait comes on top of each pause.
    let wait = Wait {
        patience,
        from_call: true,
        whole_pauses: true,
    };
    let mut retry = Retry::new(wait);
    loop {
        let error = match change().await {
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => e,
            done => return done,
        };
        if !retry.retries(Verdict::Again) {
            return Err(error);
        }
        tracing::info!(error = %error, "a fence change waited for checked transactions; retrying");
        retry.pause().await;
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
