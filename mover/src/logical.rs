//! Method `logical`: one publication on the source, row-filtered on the entity's key for each of
//! its tables (insert, update, delete; never truncate, which a row filter does not apply to), and
//! one subscription on the target that copies and then streams. Publication, slot and
//! subscription all carry the move's `replication_name`.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::catalog::EntityTable;

/// Creates the publication unless it exists.
pub(crate) async fn ensure_publication(
    source: &Client,
    name: &str,
    tables: &[EntityTable],
    entity_id: &str,
) -> Result<(), tokio_postgres::Error> {
    let exists = source
        .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&name])
        .await?
        .is_some();
    if exists {
        return Ok(());
    }
    let quoted: Vec<&str> = tables.iter().map(|t| t.quoted.as_str()).collect();
    let keys: Vec<&str> = tables.iter().map(|t| t.key_quoted.as_str()).collect();
    // The row filter needs a literal; the server quotes it. Table and key come quoted already.
    let ddl: String = source
        .query_one(
            "SELECT format('CREATE PUBLICATION %I FOR %s \
                            WITH (publish = ''insert, update, delete'', publish_via_partition_root = true)',
                           $1::text,
                           string_agg(format('TABLE %s WHERE (%s = %L)', t.quoted, t.key, $2::text), ', '))
             FROM unnest($3::text[], $4::text[]) AS t(quoted, key)",
            &[&name, &entity_id, &quoted, &keys],
        )
        .await?
        .get(0);
    source.batch_execute(&ddl).await
}

async fn slot_exists(source: &Client, name: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(source
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?
        .is_some())
}

const SUBSCRIPTION_EXISTS: &str = "SELECT 1 FROM pg_subscription WHERE subname = $1 \
     AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// Creates the subscription unless it exists. It copies the existing rows, then streams;
/// `disable_on_error` stops it at the first conflict instead of retrying forever, and
/// `synchronous_commit = on` makes the slot's confirmed position follow each applied commit
/// promptly, which is what the freeze waits on.
pub(crate) async fn ensure_subscription(
    source: &Client,
    target: &Client,
    name: &str,
    publisher_conninfo: &str,
) -> Result<(), tokio_postgres::Error> {
    if target
        .query_opt(SUBSCRIPTION_EXISTS, &[&name])
        .await?
        .is_some()
    {
        return Ok(());
    }
    // A slot without its subscription: CREATE SUBSCRIPTION made it, then failed. It is ours.
    if slot_exists(source, name).await? {
        drop_slot(source, name).await?;
    }
    let ddl: String = target
        .query_one(
            "SELECT format('CREATE SUBSCRIPTION %I CONNECTION %L PUBLICATION %I \
                            WITH (slot_name = %L, copy_data = true, disable_on_error = true, \
                                  synchronous_commit = ''on'')',
                           $1::text, $2::text, $1::text, $1::text)",
            &[&name, &publisher_conninfo],
        )
        .await?
        .get(0);
    target.batch_execute(&ddl).await
}

/// Gathers statistics on the entity's tables (the target's, once the initial copy is in). A table
/// the mover's role does not own is skipped with a warning, as ANALYZE does.
pub(crate) async fn analyze(
    target: &Client,
    tables: &[EntityTable],
) -> Result<(), tokio_postgres::Error> {
    let names: Vec<&str> = tables.iter().map(|t| t.quoted.as_str()).collect();
    target
        .batch_execute(&format!("ANALYZE {}", names.join(", ")))
        .await
}

/// What the target says about the subscription's tables.
#[derive(Debug, Default)]
pub(crate) struct SyncState {
    pub exists: bool,
    pub enabled: bool,
    /// Apply and sync errors counted by `pg_stat_subscription_stats`.
    pub errors: i64,
    /// `(table, ready, rows copied so far)` for each table of the subscription.
    pub tables: Vec<(String, bool, i64)>,
}

impl SyncState {
    pub fn all_ready(&self) -> bool {
        !self.tables.is_empty() && self.tables.iter().all(|(_, ready, _)| *ready)
    }
}

pub(crate) async fn sync_state(
    target: &Client,
    name: &str,
) -> Result<SyncState, tokio_postgres::Error> {
    let rows = target
        .query(
            "SELECT s.subenabled,
                    coalesce((SELECT st.apply_error_count + st.sync_error_count
                                FROM pg_stat_subscription_stats st WHERE st.subid = s.oid), 0),
                    format('%s.%s', n.nspname, c.relname),
                    r.srsubstate = 'r',
                    coalesce((SELECT max(p.tuples_processed) FROM pg_stat_progress_copy p
                               WHERE p.relid = r.srrelid), 0)
             FROM pg_subscription s
             LEFT JOIN pg_subscription_rel r ON r.srsubid = s.oid
             LEFT JOIN pg_class c ON c.oid = r.srrelid
             LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE s.subname = $1
               AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&name],
        )
        .await?;
    let Some(first) = rows.first() else {
        return Ok(SyncState::default());
    };
    Ok(SyncState {
        exists: true,
        enabled: first.get(0),
        errors: first.get(1),
        tables: rows
            .iter()
            .filter_map(|r| {
                let table: Option<String> = r.get(2);
                Some((table?, r.get::<_, Option<bool>>(3)?, r.get(4)))
            })
            .collect(),
    })
}

/// Bytes of the source's WAL the slot has not confirmed yet.
pub(crate) async fn lag_bytes(source: &Client, name: &str) -> Result<i64, tokio_postgres::Error> {
    Ok(source
        .query_opt(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?
        .and_then(|r| r.get::<_, Option<i64>>(0))
        .unwrap_or(0))
}

/// A source WAL position that every transaction committed before this call precedes. A small
/// committed WAL record is written after it, so that the position is passed even when the source
/// is otherwise idle (an insert position on a page boundary is past the last record's end).
pub(crate) async fn catchup_position(source: &Client) -> Result<String, tokio_postgres::Error> {
    let lsn: String = source
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    source
        .batch_execute(
            "BEGIN; SET LOCAL synchronous_commit = on; \
             SELECT pg_logical_emit_message(true, 'shard_directory', 'catch-up'); COMMIT",
        )
        .await?;
    Ok(lsn)
}

/// Whether the slot has confirmed `lsn`; the confirmed position, and how far behind it is.
pub(crate) async fn confirmed(
    source: &Client,
    name: &str,
    lsn: &str,
) -> Result<(bool, String, i64), tokio_postgres::Error> {
    let row = source
        .query_one(
            "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false),
                    coalesce(confirmed_flush_lsn::text, ''),
                    coalesce(pg_wal_lsn_diff($2::text::pg_lsn, confirmed_flush_lsn)::int8, 0)
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name, &lsn],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

/// Drops the slot, waiting for its WAL sender to let go (ending it after a while).
pub(crate) async fn drop_slot(source: &Client, name: &str) -> Result<(), tokio_postgres::Error> {
    let start = Instant::now();
    loop {
        let active: Option<i32> = match source
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await?
        {
            None => return Ok(()),
            Some(r) => r.get(0),
        };
        match active {
            None => {
                source
                    .execute("SELECT pg_drop_replication_slot($1)", &[&name])
                    .await?;
                return Ok(());
            }
            Some(pid) if start.elapsed() > Duration::from_secs(5) => {
                source
                    .execute("SELECT pg_terminate_backend($1, 5000)", &[&pid])
                    .await?;
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Drops the subscription, if it exists. DROP SUBSCRIPTION also drops its slot on the source;
/// when the source cannot be reached, the slot is detached first and left to
/// `drop_publication` / `cleanup`.
pub(crate) async fn drop_subscription(
    target: &Client,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    if target
        .query_opt(SUBSCRIPTION_EXISTS, &[&name])
        .await?
        .is_none()
    {
        return Ok(());
    }
    let quoted: String = target
        .query_one("SELECT quote_ident($1)", &[&name])
        .await?
        .get(0);
    if target
        .batch_execute(&format!("DROP SUBSCRIPTION {quoted}"))
        .await
        .is_err()
    {
        target
            .batch_execute(&format!(
                "ALTER SUBSCRIPTION {quoted} DISABLE; \
                 ALTER SUBSCRIPTION {quoted} SET (slot_name = NONE); \
                 DROP SUBSCRIPTION {quoted}"
            ))
            .await?;
    }
    Ok(())
}

/// Drops the slot and the publication, whichever exist.
pub(crate) async fn drop_publication(
    source: &Client,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    drop_slot(source, name).await?;
    let ddl: String = source
        .query_one(
            "SELECT format('DROP PUBLICATION IF EXISTS %I', $1::text)",
            &[&name],
        )
        .await?
        .get(0);
    source.batch_execute(&ddl).await
}

/// Replication objects of moves on this shard: `(kind, name)` for every publication, slot and
/// subscription named `sd_move_<id>`.
pub(crate) async fn objects(
    client: &Client,
) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT 'publication', pubname::text FROM pg_publication WHERE pubname ~ '^sd_move_[0-9]+$'
             UNION ALL
             SELECT 'slot', slot_name::text FROM pg_replication_slots WHERE slot_name ~ '^sd_move_[0-9]+$'
             UNION ALL
             SELECT 'subscription', subname::text FROM pg_subscription
              WHERE subname ~ '^sd_move_[0-9]+$'
                AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
