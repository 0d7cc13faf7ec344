//! Method `logical`: one publication on the source, row-filtered on the entity's key for each of
//! its tables (insert, update, delete; never truncate, which a row filter does not apply to), and
//! one subscription on the target that copies and then streams. Publication, slot and
//! subscription all carry the move's `replication_name`.
//!
//! A `--reversible` move also makes a way back (`sd_move_<id>_back`): the same objects the
//! other way, a publication and slot on the target and a subscription on the source, which
//! copies nothing (the source has the rows). Its slot is created before the freeze and moved,
//! under the freeze, past everything the move itself wrote on the target, so it carries exactly
//! the writes made there after the cutover; it is turned on only once the forward replication is
//! gone, so no change goes round in a circle. A `revert` adopts it as its own replication.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::error::{At, Error, Step};
use crate::shards::catalog::EntityTable;

/// Why creating or adopting a replication object did not succeed.
#[derive(Debug)]
pub(crate) enum Trouble {
    /// On the publisher (the shard the rows come from).
    Db(tokio_postgres::Error),
    /// On the subscriber: the subscription is the other shard's.
    Subscriber(tokio_postgres::Error),
    /// An object of this move's name exists but says it belongs to another move.
    NotOurs(String),
    /// The slot waited too long for these transactions in progress on the source.
    Blocked(String),
}

impl From<tokio_postgres::Error> for Trouble {
    fn from(e: tokio_postgres::Error) -> Trouble {
        Trouble::Db(e)
    }
}

impl Trouble {
    /// The same trouble, met on the subscriber.
    fn on_subscriber(self) -> Trouble {
        match self {
            Trouble::Db(e) => Trouble::Subscriber(e),
            other => other,
        }
    }
}

/// What a replication object of this move says about itself (its COMMENT): an object found by
/// its name is adopted only when it says this, so a leftover of another move that happened to get
/// the same id (another directory, a restore) is never taken for this move's.
pub(crate) fn signature(record: &crate::directory::record::MoveRecord) -> String {
    if let Some(reversible) = record.reverses {
        return way_back_signature(
            reversible,
            &record.entity(),
            &record.source_shard,
            &record.target_shard,
        );
    }
    format!(
        "shard_directory move {} of {} from {} to {}, started {}",
        record.move_id,
        record.entity(),
        record.source_shard,
        record.target_shard,
        record.started_at
    )
}

/// The name of reversible move `move_id`'s way back.
pub(crate) fn way_back_name(move_id: i64) -> String {
    format!("sd_move_{move_id}_back")
}

/// What the way back of reversible move `move_id` says about itself, from `from` (its target) to
/// `to` (its source): the same as its revert's [`signature`], which adopts it.
pub(crate) fn way_back_signature(
    move_id: i64,
    key: &shard_directory_protocol::EntityKey,
    from: &str,
    to: &str,
) -> String {
    format!("shard_directory way back of move {move_id} of {key} from {from} to {to}")
}

/// Whether the object `describe` (a query of its COMMENT, `$1` = its name) finds exists; refuses
/// one whose COMMENT is not `expected`.
async fn adoptable(
    client: &Client,
    describe: &str,
    kind: &str,
    name: &str,
    expected: &str,
) -> Result<bool, Trouble> {
    let found = client.query_opt(describe, &[&name]).await?;
    let Some(row) = found else { return Ok(false) };
    let comment: Option<String> = row.get(0);
    match comment {
        Some(c) if c == expected => Ok(true),
        other => Err(Trouble::NotOurs(format!(
            "{kind} {name} exists but is not this move's (it says {}); if it is left over, drop it \
             (`shard-directory cleanup` drops those of finished moves) and resume",
            other.map_or("nothing".to_owned(), |c| format!("\"{c}\""))
        ))),
    }
}

/// Creates the publication unless this move's exists.
pub(crate) async fn ensure_publication(
    source: &Client,
    name: &str,
    tables: &[EntityTable],
    entity_id: &str,
    signature: &str,
) -> Result<(), Trouble> {
    if adoptable(source, DESCRIBE_PUBLICATION, "publication", name, signature).await? {
        return Ok(());
    }
    create_publication(source, name, tables, entity_id, Publish::Move(signature)).await?;
    Ok(())
}

/// What a publication of the entity's rows is for.
pub(crate) enum Publish<'a> {
    /// The move's own, subscribed to, with its signature: never truncations, which a row filter
    /// does not apply to (the subscriber would empty the whole table).
    Move(&'a str),
    /// Change tracking's, only ever decoded by the mover: truncations too.
    Tracking,
}

/// Creates a publication of the entity's rows in `tables`, row-filtered on its key.
pub(crate) async fn create_publication(
    client: &Client,
    name: &str,
    tables: &[EntityTable],
    entity_id: &str,
    publish: Publish<'_>,
) -> Result<(), tokio_postgres::Error> {
    let (operations, comment) = match publish {
        Publish::Move(signature) => ("insert, update, delete", signature),
        Publish::Tracking => (
            "insert, update, delete, truncate",
            "shard_directory change tracking",
        ),
    };
    let quoted: Vec<&str> = tables.iter().map(|t| t.quoted.as_str()).collect();
    let keys: Vec<&str> = tables.iter().map(|t| t.key_quoted.as_str()).collect();
    let types: Vec<&str> = tables.iter().map(|t| t.key_type.as_str()).collect();
    // The row filter needs a literal; the server quotes it. Table, key and type come quoted.
    let ddl: String = client
        .query_one(
            "SELECT format('CREATE PUBLICATION %I FOR %s \
                            WITH (publish = %L, publish_via_partition_root = true); \
                            COMMENT ON PUBLICATION %I IS %L',
                           $1::text,
                           string_agg(format('TABLE %s WHERE (%s = %L::%s)', t.quoted, t.key, $2::text, t.type), ', '),
                           $7::text, $1::text, $5::text)
             FROM unnest($3::text[], $4::text[], $6::text[]) AS t(quoted, key, type)",
            &[&name, &entity_id, &quoted, &keys, &comment, &types, &operations],
        )
        .await?
        .get(0);
    client.batch_execute(&ddl).await
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

/// The transactions in progress on a server other than the caller's, for a message.
pub(crate) async fn transactions_in_progress(
    client: &Client,
) -> Result<String, tokio_postgres::Error> {
    let listed: Option<String> = client
        .query_one(
            "SELECT string_agg(format('pid %s (%s, %s, since %s)', pid, coalesce(state, '?'), \
                                      coalesce(nullif(application_name, ''), usename::text, '?'), \
                                      to_char(xact_start AT TIME ZONE 'UTC', 'HH24:MI:SS')), \
                               ', ' ORDER BY xact_start) \
             FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) \
               AND backend_type = 'client backend'",
            &[],
        )
        .await?
        .get(0);
    Ok(listed.unwrap_or_else(|| "none left by the time it looked".to_owned()))
}

/// The subscription's slot, made on the source: it waits until every transaction in progress
/// there has ended, for at most `wait` (then [`Trouble::Blocked`], naming them, and nothing is
/// left behind). A slot without its subscription is from an earlier attempt of this move.
async fn create_slot(source: &Client, name: &str, wait: Duration) -> Result<(), Trouble> {
    if slot_exists(source, name).await? {
        drop_slot(source, name).await?;
    }
    source
        .batch_execute(&format!(
            "SET statement_timeout = {}",
            wait.as_millis().max(1)
        ))
        .await?;
    let created = source
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&name],
        )
        .await;
    source.batch_execute("RESET statement_timeout").await?;
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {
            Err(Trouble::Blocked(transactions_in_progress(source).await?))
        }
        Err(e) => Err(e.into()),
    }
}

/// How a new subscription begins.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begin {
    /// A move's: copies the existing rows, then streams.
    CopyThenStream,
    /// Created off and copying nothing: a way back's (its subscriber has the rows), and a paced
    /// move's (the mover copies, `initial_copy`); it streams from its slot's position once
    /// turned on.
    Off,
}

/// The COMMENT of a subscription, by its name (`$1`), in this database.
const DESCRIBE_PUBLICATION: &str =
    "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1";

const DESCRIBE_SUBSCRIPTION: &str =
    "SELECT obj_description(oid, 'pg_subscription') FROM pg_subscription \
     WHERE subname = $1 \
       AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// What the publication `name` says about itself, if it exists.
pub(crate) async fn publication_comment(
    source: &Client,
    name: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(source
        .query_opt(DESCRIBE_PUBLICATION, &[&name])
        .await?
        .and_then(|r| r.get(0)))
}

/// What the subscription `name` says about itself, if it exists.
pub(crate) async fn subscription_comment(
    target: &Client,
    name: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(target
        .query_opt(DESCRIBE_SUBSCRIPTION, &[&name])
        .await?
        .and_then(|r| r.get(0)))
}

/// Creates the subscription unless this move's exists, on a slot made first on the source (so
/// the wait for the source's transactions in progress is bounded by `slot_wait` and names them).
/// `disable_on_error` stops it at the first conflict instead of retrying forever, and
/// `synchronous_commit = on` makes the slot's confirmed position follow each applied commit
/// promptly, which is what the freeze waits on.
pub(crate) async fn ensure_subscription(
    source: &Client,
    target: &Client,
    name: &str,
    publisher_conninfo: &str,
    signature: &str,
    slot_wait: Duration,
    begin: Begin,
) -> Result<(), Trouble> {
    if adoptable(
        target,
        DESCRIBE_SUBSCRIPTION,
        "subscription",
        name,
        signature,
    )
    .await
    .map_err(Trouble::on_subscriber)?
    {
        return Ok(());
    }
    create_slot(source, name, slot_wait).await?;
    let ddl: String = target
        .query_one(
            "SELECT format('CREATE SUBSCRIPTION %I CONNECTION %L PUBLICATION %I \
                            WITH (slot_name = %L, create_slot = false, copy_data = %s, \
                                  enabled = %s, disable_on_error = true, \
                                  synchronous_commit = ''on''); \
                            COMMENT ON SUBSCRIPTION %I IS %L',
                           $1::text, $2::text, $1::text, $1::text, $4::text, $4::text, $1::text,
                           $3::text)",
            &[
                &name,
                &publisher_conninfo,
                &signature,
                &(if begin == Begin::CopyThenStream {
                    "true"
                } else {
                    "false"
                }),
            ],
        )
        .await
        .map_err(Trouble::Subscriber)?
        .get(0);
    target
        .batch_execute(&ddl)
        .await
        .map_err(Trouble::Subscriber)
}

/// Turns a subscription that stopped after an error (`disable_on_error`) back on.
pub(crate) async fn enable_subscription(
    target: &Client,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    let ddl: String = target
        .query_one(
            "SELECT format('ALTER SUBSCRIPTION %I ENABLE', $1::text)",
            &[&name],
        )
        .await?
        .get(0);
    target.batch_execute(&ddl).await
}

/// Moves the slot past every transaction flushed on its server so far (it must not be in use):
/// a way back's, under the freeze, past the move's own writes on the target.
pub(crate) async fn skip_to_now(client: &Client, name: &str) -> Result<(), tokio_postgres::Error> {
    advance_slot(
        client,
        "SELECT pg_replication_slot_advance($1, pg_current_wal_flush_lsn())",
        &[&name],
    )
    .await
}

/// Makes the slots' positions on `client`'s server durable (`CHECKPOINT`): a slot moved with
/// `pg_replication_slot_advance` is written to disk only at the next checkpoint, and a crash
/// before it puts the slot back where it was, so that the subscription would stream again what
/// the mover's own copy holds (and stop on its keys for ever). Needs `pg_checkpoint` (or a
/// superuser); without it the position stays in memory until the server's next checkpoint,
/// said in a WARN.
pub(crate) async fn persist_slots(
    client: &Client,
    shard: &str,
) -> Result<(), tokio_postgres::Error> {
    match client.batch_execute("CHECKPOINT").await {
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
            tracing::warn!(
                shard,
                "the mover may not CHECKPOINT on shard {shard} (GRANT \
                pg_checkpoint TO it): a crash of the shard before its next checkpoint would \
                stop the move's subscription on rows its copy already made"
            );
            Ok(())
        }
        done => done,
    }
}

/// How long a slot another session holds is waited for before its error is the step's.
const SLOT_IN_USE_WAIT: Duration = Duration::from_secs(10);

/// Runs `sql`, which moves a slot, again while another session holds the slot (55006): a mover
/// killed while it moved the slot leaves its session doing so until the server notices, and the
/// resume must not fail (and abort the move) on it.
async fn advance_slot(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<(), tokio_postgres::Error> {
    let start = Instant::now();
    loop {
        match client.execute(sql, params).await {
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                    && start.elapsed() < SLOT_IN_USE_WAIT =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            done => return done.map(|_| ()),
        }
    }
}

/// Moves the slot (not in use) to `lsn`, a position read on its server: once that position is
/// flushed, which a small committed WAL record ensures, since a slot is moved no further than
/// the flushed WAL.
pub(crate) async fn advance_to(
    client: &Client,
    name: &str,
    lsn: &str,
) -> Result<(), tokio_postgres::Error> {
    emit_flushed(client, "snapshot").await?;
    advance_slot(
        client,
        "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
        &[&name, &lsn],
    )
    .await
}

/// WAL the slot keeps on the source (bytes from its restart position to the insert position),
/// and whether the server has already removed WAL it needed (`max_slot_wal_keep_size`).
pub(crate) async fn retained_wal(
    source: &Client,
    name: &str,
) -> Result<Option<(i64, bool)>, tokio_postgres::Error> {
    Ok(source
        .query_opt(
            "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8, 0), \
                    coalesce(wal_status = 'lost', false) \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// Fails with [`Error::SlotLag`] once the slot keeps more than `limit` bytes of WAL on the
/// source (or lost WAL it needed); reports what it keeps.
pub(crate) async fn check_slot(
    (source, shard): (&Client, &str),
    (move_id, name): (i64, &str),
    limit: i64,
    step: Step,
) -> Result<(), Error> {
    let retained = retained_wal(source, name).await.at(step, shard)?;
    if let Some((retained, lost)) = retained {
        crate::report::telemetry::retained_wal(move_id, retained);
        if lost || retained > limit {
            return Err(Error::SlotLag {
                step,
                name: name.to_owned(),
                shard: shard.to_owned(),
                retained,
                limit,
            });
        }
    }
    Ok(())
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
    emit_flushed(source, "catch-up").await?;
    Ok(lsn)
}

/// Commits a small WAL record (a logical message, `what`) and waits for it to be flushed, so
/// that every position read before it is flushed too.
async fn emit_flushed(client: &Client, what: &str) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL synchronous_commit = on; \
             SELECT pg_logical_emit_message(true, 'shard_directory', '{what}'); COMMIT"
        ))
        .await
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
/// subscription named `sd_move_<id>` (change tracking's publications, `sd_move_<id>_track`, and
/// the way back's objects, `sd_move_<id>_back`).
pub(crate) async fn objects(
    client: &Client,
) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT 'publication', pubname::text FROM pg_publication WHERE pubname ~ '^sd_move_[0-9]+(_track|_back)?$'
             UNION ALL
             SELECT 'slot', slot_name::text FROM pg_replication_slots WHERE slot_name ~ '^sd_move_[0-9]+(_back)?$'
             UNION ALL
             SELECT 'subscription', subname::text FROM pg_subscription
              WHERE subname ~ '^sd_move_[0-9]+(_back)?$'
                AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The server's system identifier: tablesync slots on a source carry their subscriber's.
pub(crate) async fn system_identifier(client: &Client) -> Result<String, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await?
        .get(0))
}

/// The OIDs of every subscription on the server.
pub(crate) async fn subscription_oids(client: &Client) -> Result<Vec<i64>, tokio_postgres::Error> {
    let rows = client
        .query("SELECT oid::int8 FROM pg_subscription", &[])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The inactive tablesync slots on the server, PostgreSQL's `pg_<subscription oid>_sync_<table
/// oid>_<subscriber's system identifier>`: `(slot, subscription oid, system identifier)`. A
/// subscription dropped while its source was unreachable leaves them behind.
pub(crate) async fn tablesync_slots(
    client: &Client,
) -> Result<Vec<(String, i64, String)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT slot_name::text, m[1]::int8, m[2] \
             FROM pg_replication_slots, \
                  regexp_match(slot_name, '^pg_([0-9]+)_sync_[0-9]+_([0-9]+)$') m \
             WHERE m IS NOT NULL AND NOT active",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}
