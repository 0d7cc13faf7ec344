//! What the directory says about an entity: its entry now, where it was at a time, its history.

use serde::Serialize;
use shard_directory_client::{EntityKey, State};
use tokio_postgres::GenericClient;

/// An entry as the mover reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub shard_name: String,
    pub state: State,
    pub target_shard: Option<String>,
    /// The version that last changed the entry.
    pub version: i64,
}

pub(crate) async fn read(
    c: &impl GenericClient,
    key: &EntityKey,
) -> Result<Option<Placement>, tokio_postgres::Error> {
    let row = c
        .query_opt(
            "SELECT shard_name, state, target_shard, version FROM shard_directory.shard_directory \
             WHERE entity_type = $1 AND entity_id = $2",
            &[&key.entity_type, &key.entity_id],
        )
        .await?;
    Ok(row.map(|r| placement(&r, 0)))
}

/// The placement in columns `at..at + 4` of `r`: shard_name, state, target_shard, version.
fn placement(r: &tokio_postgres::Row, at: usize) -> Placement {
    Placement {
        shard_name: r.get(at),
        // A state this mover does not know is taken as the most restrictive one.
        state: r.get::<_, &str>(at + 1).parse().unwrap_or(State::ReadOnly),
        target_shard: r.get(at + 2),
        version: r.get(at + 3),
    }
}

/// The entries of `ids` of `entity_type` that exist, by id.
pub(crate) async fn read_many(
    c: &impl GenericClient,
    entity_type: &str,
    ids: &[&str],
) -> Result<std::collections::HashMap<String, Placement>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT entity_id, shard_name, state, target_shard, version \
             FROM shard_directory.shard_directory WHERE entity_type = $1 AND entity_id = ANY ($2)",
            &[&entity_type, &ids],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), placement(r, 1))).collect())
}

pub(crate) async fn current_version(c: &impl GenericClient) -> Result<i64, tokio_postgres::Error> {
    Ok(c.query_one("SELECT shard_directory.current_version()", &[])
        .await?
        .get(0))
}

/// The shard that held the entity at `at` (any `timestamptz` input), from history.
pub(crate) async fn placement_at(
    c: &impl GenericClient,
    key: &EntityKey,
    at: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(c.query_one(
        "SELECT shard_directory.placement_at($1, $2, $3::text::timestamptz)",
        &[&key.entity_type, &key.entity_id, &at],
    )
    .await?
    .get(0))
}

/// One history row.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryRow {
    pub changed_at: String,
    pub op: String,
    pub transition: String,
    pub old_shard: Option<String>,
    pub new_shard: Option<String>,
    pub new_state: Option<String>,
    pub new_target: Option<String>,
    pub version: i64,
    pub changed_by: String,
}

pub(crate) async fn history(
    c: &impl GenericClient,
    key: &EntityKey,
) -> Result<Vec<HistoryRow>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT to_char(changed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), op, \
                    transition, old_shard, new_shard, new_state, new_target, version, changed_by \
             FROM shard_directory.shard_directory_history \
             WHERE entity_type = $1 AND entity_id = $2 ORDER BY history_id",
            &[&key.entity_type, &key.entity_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| HistoryRow {
            changed_at: r.get(0),
            op: r.get(1),
            transition: r.get(2),
            old_shard: r.get(3),
            new_shard: r.get(4),
            new_state: r.get(5),
            new_target: r.get(6),
            version: r.get(7),
            changed_by: r.get(8),
        })
        .collect())
}
