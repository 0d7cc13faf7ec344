//! The move record, `shard_directory.shard_moves` in the directory database: what the mover
//! reads to resume and what `status --json` prints. Directory steps that change an entry
//! (`begin_move`, `freeze`, `complete_move`, `abort_move`) commit in the same transaction as the
//! record's phase, so the two never disagree.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio_postgres::{GenericClient, Row};

use crate::directory::phase::Phase;
use crate::shards::fence::Fence;

/// How a move carries the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// A row-filtered publication and a subscription: copy, then stream; a short freeze.
    Logical,
    /// A copy while the entity is frozen: for sources without logical decoding.
    Copy,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Logical => "logical",
            Method::Copy => "copy",
        }
    }

    /// The phases a move by this method passes through, in order, up to `done`.
    pub fn phases(self) -> &'static [Phase] {
        use Phase::*;
        match self {
            Method::Logical => &[
                Migrating, Copying, CatchingUp, Frozen, Verified, Cutover, CleaningUp, Done,
            ],
            Method::Copy => &[Migrating, Frozen, Verified, Cutover, CleaningUp, Done],
        }
    }
}

/// Per table: the entity's rows on the source when the move began, and how far copy and delete got.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableProgress {
    pub rows: i64,
    #[serde(default)]
    pub copied: i64,
    #[serde(default)]
    pub verified: Option<i64>,
    #[serde(default)]
    pub deleted: i64,
    /// While its rows are being copied or deleted: rows per second so far, and the seconds left
    /// at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_per_second: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
}

/// One row of `shard_moves`. Its JSON form (`status --json`) is stable for scripts: times are
/// RFC 3339 in UTC, durations in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct MoveRecord {
    pub move_id: i64,
    pub entity_type: String,
    pub entity_id: String,
    pub source_shard: String,
    pub target_shard: String,
    pub method: Method,
    pub phase: Phase,
    pub keep_source: bool,
    pub max_freeze_ms: i64,
    /// The publication, slot and subscription of a logical move.
    pub replication_name: String,
    pub source_fence: Fence,
    pub target_fence: Fence,
    pub tables: BTreeMap<String, TableProgress>,
    pub freeze_version: Option<i64>,
    pub cutover_version: Option<i64>,
    pub catchup_lsn: Option<String>,
    pub confirmed_lsn: Option<String>,
    pub freeze_started_at: Option<String>,
    /// When a freeze no mover ended may be released (`release_expired_freeze`).
    pub freeze_lease_until: Option<String>,
    pub max_freeze_seen_ms: Option<i64>,
    pub last_error: Option<String>,
    pub started_by: String,
    pub started_at: String,
    pub updated_at: String,
    pub finished_at: Option<String>,
    /// Made with `--reversible`: a way back after the cutover.
    pub reversible: bool,
    pub reversible_for_ms: Option<i64>,
    /// Once reversible: when `finalize --expired` may finalize it.
    pub reversible_until: Option<String>,
    /// When `finalize` was asked: the way back is dropped and the source cleared.
    pub finalized_at: Option<String>,
    /// The reversible move this one takes back (`revert`).
    pub reverses: Option<i64>,
}

const COLUMNS: &str = r#"move_id, entity_type, entity_id, source_shard, target_shard, method, phase,
    keep_source, (extract(epoch FROM max_freeze) * 1000)::int8, replication_name,
    source_fence::text, target_fence::text, tables::text, freeze_version, cutover_version,
    catchup_lsn::text, confirmed_lsn::text,
    to_char(freeze_started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    (extract(epoch FROM max_freeze_seen) * 1000)::int8, last_error, started_by,
    to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    to_char(freeze_lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    reversible, (extract(epoch FROM reversible_for) * 1000)::int8,
    to_char(reversible_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    to_char(finalized_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), reverses"#;

fn json<T: serde::de::DeserializeOwned>(row: &Row, i: usize) -> T {
    serde_json::from_str(row.get(i)).expect("the record's JSON columns are written by the mover")
}

impl MoveRecord {
    fn from_row(r: &Row) -> MoveRecord {
        MoveRecord {
            move_id: r.get(0),
            entity_type: r.get(1),
            entity_id: r.get(2),
            source_shard: r.get(3),
            target_shard: r.get(4),
            method: if r.get::<_, &str>(5) == "copy" {
                Method::Copy
            } else {
                Method::Logical
            },
            phase: Phase::parse(r.get(6)).expect("the phase CHECK constraint lists the phases"),
            keep_source: r.get(7),
            max_freeze_ms: r.get(8),
            replication_name: r.get(9),
            source_fence: json(r, 10),
            target_fence: json(r, 11),
            tables: json(r, 12),
            freeze_version: r.get(13),
            cutover_version: r.get(14),
            catchup_lsn: r.get(15),
            confirmed_lsn: r.get(16),
            freeze_started_at: r.get(17),
            max_freeze_seen_ms: r.get(18),
            last_error: r.get(19),
            started_by: r.get(20),
            started_at: r.get(21),
            updated_at: r.get(22),
            finished_at: r.get(23),
            freeze_lease_until: r.get(24),
            reversible: r.get(25),
            reversible_for_ms: r.get(26),
            reversible_until: r.get(27),
            finalized_at: r.get(28),
            reverses: r.get(29),
        }
    }

    pub fn entity(&self) -> shard_directory_protocol::EntityKey {
        shard_directory_protocol::EntityKey::new(&self.entity_type, &self.entity_id)
    }

    /// Freeze time so far (or in all, once the move is past its cutover or aborted).
    pub fn freeze_time(&self) -> Option<std::time::Duration> {
        self.max_freeze_seen_ms
            .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64))
    }
}

pub(crate) async fn load(
    c: &impl GenericClient,
    move_id: i64,
) -> Result<Option<MoveRecord>, tokio_postgres::Error> {
    let sql = format!("SELECT {COLUMNS} FROM shard_directory.shard_moves WHERE move_id = $1");
    Ok(c.query_opt(&sql, &[&move_id])
        .await?
        .as_ref()
        .map(MoveRecord::from_row))
}

/// The moves `filter` (a condition on `shard_moves`, its parameters `params`) selects, newest
/// first.
async fn select(
    c: &impl GenericClient,
    filter: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<MoveRecord>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM shard_directory.shard_moves WHERE {filter} ORDER BY move_id DESC"
    );
    Ok(c.query(&sql, params)
        .await?
        .iter()
        .map(MoveRecord::from_row)
        .collect())
}

/// Every move, newest first; only the open ones with `open_only`, only those started at or
/// after `since` with it.
pub(crate) async fn list(
    c: &impl GenericClient,
    open_only: bool,
    since: Option<&str>,
) -> Result<Vec<MoveRecord>, tokio_postgres::Error> {
    let filter = "(finished_at IS NULL OR NOT $1) \
                  AND ($2::text IS NULL OR started_at >= $2::text::timestamptz)";
    select(c, filter, &[&open_only, &since]).await
}

/// Every open move, and every move finished at or after `since` (any timestamptz input),
/// newest first.
pub(crate) async fn open_or_finished_since(
    c: &impl GenericClient,
    since: &str,
) -> Result<Vec<MoveRecord>, tokio_postgres::Error> {
    let filter = "finished_at IS NULL OR finished_at >= $1::text::timestamptz";
    select(c, filter, &[&since]).await
}

/// Every move of `key`, newest first.
pub(crate) async fn of_entity(
    c: &impl GenericClient,
    key: &shard_directory_protocol::EntityKey,
) -> Result<Vec<MoveRecord>, tokio_postgres::Error> {
    let filter = "entity_type = $1 AND entity_id = $2";
    select(c, filter, &[&key.entity_type, &key.entity_id]).await
}

/// What a new record says.
pub(crate) struct NewMove<'a> {
    pub entity: &'a shard_directory_protocol::EntityKey,
    pub source: &'a str,
    pub target: &'a str,
    pub method: Method,
    pub keep_source: bool,
    pub max_freeze: std::time::Duration,
    pub source_fence: &'a Fence,
    pub target_fence: &'a Fence,
    pub tables: &'a BTreeMap<String, TableProgress>,
    /// The batch (`shard_move_batches`) the move runs in, if any.
    pub batch_id: Option<i64>,
    pub reversible: bool,
    pub reversible_for: Option<std::time::Duration>,
    /// The reversible move this one reverts.
    pub reverses: Option<i64>,
}

pub(crate) async fn insert(
    c: &impl GenericClient,
    m: &NewMove<'_>,
) -> Result<i64, tokio_postgres::Error> {
    Ok(c.query_one(
        "INSERT INTO shard_directory.shard_moves (entity_type, entity_id, source_shard, target_shard, \
             method, keep_source, max_freeze, source_fence, target_fence, tables, batch_id, \
             reversible, reversible_for, reverses) \
         VALUES ($1, $2, $3, $4, $5, $6, make_interval(secs => $7), $8::text::jsonb, $9::text::jsonb, \
                 $10::text::jsonb, $11, $12, make_interval(secs => $13), $14) \
         RETURNING move_id",
        &[
            &m.entity.entity_type,
            &m.entity.entity_id,
            &m.source,
            &m.target,
            &m.method.as_str(),
            &m.keep_source,
            &m.max_freeze.as_secs_f64(),
            &to_json(m.source_fence),
            &to_json(m.target_fence),
            &to_json(m.tables),
            &m.batch_id,
            &m.reversible,
            &m.reversible_for.map(|d| d.as_secs_f64()),
            &m.reverses,
        ],
    )
    .await?
    .get(0))
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serialises")
}

/// Moves the phase from `from` to `to`, unless another process has moved it on meanwhile (then
/// `false`, and nothing changes): a phase is written only from the phase its writer believes the
/// move is in. The final phases set `finished_at`; the cutover or an abort closes the freeze
/// clock (`max_freeze_seen`); a step forward clears `last_error`, which then says what stopped
/// the move last, if anything still does.
pub(crate) async fn set_phase(
    c: &impl GenericClient,
    move_id: i64,
    from: Phase,
    to: Phase,
) -> Result<bool, tokio_postgres::Error> {
    let n = c
        .execute(
            "UPDATE shard_directory.shard_moves SET phase = $3, updated_at = now(), \
                 finished_at = CASE WHEN $3 IN ('done', 'reverted', 'aborted') THEN now() END, \
                 reversible_until = CASE WHEN $3 = 'reversible' THEN now() + reversible_for \
                     ELSE reversible_until END, \
                 max_freeze_seen = CASE WHEN $3 IN ('cutover', 'aborted') AND freeze_started_at IS NOT NULL \
                     THEN greatest(coalesce(max_freeze_seen, '0'), clock_timestamp() - freeze_started_at) \
                     ELSE max_freeze_seen END, \
                 last_error = CASE WHEN $3 IN ('aborting', 'aborted') THEN last_error END \
             WHERE move_id = $1 AND phase = $2",
            &[&move_id, &from.as_str(), &to.as_str()],
        )
        .await?;
    Ok(n == 1)
}

/// Locks the move's row for the rest of the directory transaction `c` is in: a step that changes
/// the entry takes it first, as `release_expired_freeze` does, so one waits for the other.
/// Returns the phase and whether the freeze's lease (if any) is still running.
pub(crate) async fn lock(
    c: &impl GenericClient,
    move_id: i64,
) -> Result<(Phase, bool), tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT phase, coalesce(freeze_lease_until > clock_timestamp(), true) \
             FROM shard_directory.shard_moves WHERE move_id = $1 FOR UPDATE",
            &[&move_id],
        )
        .await?;
    Ok((
        Phase::parse(row.get(0)).expect("the phase CHECK constraint lists the phases"),
        row.get(1),
    ))
}

/// The entity's reversible move other than `besides`, if it has one: no other move of the entity
/// may begin while it is (a move's record is inserted first, then this is asked, so a move that
/// became reversible meanwhile is seen).
pub(crate) async fn reversible_of(
    c: &impl GenericClient,
    key: &shard_directory_protocol::EntityKey,
    besides: Option<i64>,
) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(c.query_opt(
        "SELECT move_id FROM shard_directory.shard_moves \
             WHERE entity_type = $1 AND entity_id = $2 AND phase = 'reversible' \
               AND move_id IS DISTINCT FROM $3",
        &[&key.entity_type, &key.entity_id, &besides],
    )
    .await?
    .map(|r| r.get(0)))
}

/// Asks reversible move `move_id` to finalize: back to `cleaning_up`, which now drops its way
/// back and clears its source. Refused (`false`) unless it is reversible.
pub(crate) async fn finalize(
    c: &impl GenericClient,
    move_id: i64,
) -> Result<bool, tokio_postgres::Error> {
    let n = c
        .execute(
            "UPDATE shard_directory.shard_moves \
             SET phase = 'cleaning_up', finalized_at = now(), updated_at = now() \
             WHERE move_id = $1 AND phase = 'reversible'",
            &[&move_id],
        )
        .await?;
    Ok(n == 1)
}

/// A finalize that ends without its source (`run/way_back.rs`): `done` from `cleaning_up`, the
/// source's rows kept as `--keep-source` keeps them (for `purge-source`), and what is left there
/// in `last_error`. Refused (`false`) unless the move is being finalized.
pub(crate) async fn finish_without_source(
    c: &impl GenericClient,
    move_id: i64,
    left: &str,
) -> Result<bool, tokio_postgres::Error> {
    let n = c
        .execute(
            "UPDATE shard_directory.shard_moves \
             SET phase = 'done', finished_at = now(), updated_at = now(), keep_source = true, \
                 last_error = $2 \
             WHERE move_id = $1 AND phase = 'cleaning_up' AND finalized_at IS NOT NULL",
            &[&move_id, &left],
        )
        .await?;
    Ok(n == 1)
}

/// The reversible moves whose `reversible_until` has passed.
pub(crate) async fn expired(c: &impl GenericClient) -> Result<Vec<i64>, tokio_postgres::Error> {
    Ok(c.query(
        "SELECT move_id FROM shard_directory.shard_moves \
             WHERE phase = 'reversible' AND reversible_until < now() ORDER BY move_id",
        &[],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

pub(crate) async fn set_tables(
    c: &impl GenericClient,
    move_id: i64,
    tables: &BTreeMap<String, TableProgress>,
) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "UPDATE shard_directory.shard_moves SET tables = $2::text::jsonb, updated_at = now() \
         WHERE move_id = $1",
        &[&move_id, &to_json(tables)],
    )
    .await
    .map(|_| ())
}

pub(crate) async fn set_error(
    c: &impl GenericClient,
    move_id: i64,
    error: &str,
) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "UPDATE shard_directory.shard_moves SET last_error = $2, updated_at = now() WHERE move_id = $1",
        &[&move_id, &error],
    )
    .await
    .map(|_| ())
}

/// Records a freeze beginning: the freeze clock starts (the first time only: a resumed or retried
/// freeze counts from the first) and its lease runs `lease` from now, on the directory's clock.
pub(crate) async fn start_freeze(
    c: &impl GenericClient,
    move_id: i64,
    lease: std::time::Duration,
) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "UPDATE shard_directory.shard_moves \
         SET freeze_started_at = coalesce(freeze_started_at, clock_timestamp()), \
             freeze_lease_until = clock_timestamp() + make_interval(secs => $2), updated_at = now() \
         WHERE move_id = $1",
        &[&move_id, &lease.as_secs_f64()],
    )
    .await
    .map(|_| ())
}

/// What is left of the move's freeze lease, on the directory's clock (zero once it has ended).
pub(crate) async fn lease_left(
    c: &impl GenericClient,
    move_id: i64,
) -> Result<std::time::Duration, tokio_postgres::Error> {
    let seconds: f64 = c
        .query_one(
            "SELECT coalesce(extract(epoch FROM freeze_lease_until - clock_timestamp()), 0)::float8 \
             FROM shard_directory.shard_moves WHERE move_id = $1",
            &[&move_id],
        )
        .await?
        .get(0);
    Ok(std::time::Duration::from_secs_f64(seconds.max(0.0)))
}

/// Forgets a freeze that was undone before the entity was frozen on its source (the move goes
/// back to catching up, keeping its copy).
pub(crate) async fn end_freeze(
    c: &impl GenericClient,
    move_id: i64,
) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "UPDATE shard_directory.shard_moves \
         SET freeze_version = NULL, freeze_lease_until = NULL, catchup_lsn = NULL, \
             confirmed_lsn = NULL, freeze_started_at = NULL, updated_at = now(), \
             max_freeze_seen = greatest(coalesce(max_freeze_seen, '0'), \
                                        clock_timestamp() - freeze_started_at) \
         WHERE move_id = $1",
        &[&move_id],
    )
    .await
    .map(|_| ())
}

pub(crate) async fn set_versions(
    c: &impl GenericClient,
    move_id: i64,
    freeze_version: Option<i64>,
    cutover_version: Option<i64>,
) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "UPDATE shard_directory.shard_moves \
         SET freeze_version = coalesce($2, freeze_version), \
             cutover_version = coalesce($3, cutover_version), updated_at = now() \
         WHERE move_id = $1",
        &[&move_id, &freeze_version, &cutover_version],
    )
    .await
    .map(|_| ())
}

pub(crate) async fn set_positions(
    c: &impl GenericClient,
    move_id: i64,
    catchup_lsn: Option<&str>,
    confirmed_lsn: Option<&str>,
) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "UPDATE shard_directory.shard_moves \
         SET catchup_lsn = coalesce($2::text::pg_lsn, catchup_lsn), \
             confirmed_lsn = coalesce($3::text::pg_lsn, confirmed_lsn), updated_at = now() \
         WHERE move_id = $1",
        &[&move_id, &catchup_lsn, &confirmed_lsn],
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_goes_forward_through_the_cutover_to_done() {
        for method in [Method::Logical, Method::Copy] {
            let phases = method.phases();
            assert!(
                phases.windows(2).all(|w| w[0] < w[1]),
                "{method:?} in order"
            );
            assert_eq!(phases.last(), Some(&Phase::Done));
            assert!(phases.contains(&Phase::Frozen) && phases.contains(&Phase::Cutover));
        }
    }
}
