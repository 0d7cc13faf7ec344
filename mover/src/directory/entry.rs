//! What the directory says about an entity: its entry now, where it was at a time, its history.

use serde::Serialize;
use shard_directory_protocol::{EntityKey, State};
use tokio_postgres::GenericClient;

use crate::error::{At, Error, Place, Step};

/// An entry as the mover reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub shard_name: String,
    pub state: State,
    pub target_shard: Option<String>,
    /// The version that last changed the entry.
    pub version: i64,
}

/// Reading entries failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    Db(tokio_postgres::Error),
    /// A state this mover does not know (a newer extension's): an error, never taken for one it
    /// knows.
    UnknownState {
        entity: EntityKey,
        state: String,
    },
}

impl From<tokio_postgres::Error> for ReadError {
    fn from(e: tokio_postgres::Error) -> ReadError {
        ReadError::Db(e)
    }
}

impl<T> At<T> for Result<T, ReadError> {
    fn at(self, step: Step, place: impl Into<Place>) -> Result<T, Error> {
        self.map_err(|e| match e {
            ReadError::Db(source) => Error::Db {
                step,
                place: place.into(),
                source,
            },
            ReadError::UnknownState { entity, state } => Error::UnknownState { entity, state },
        })
    }
}

pub(crate) async fn read(
    c: &impl GenericClient,
    key: &EntityKey,
) -> Result<Option<Placement>, ReadError> {
    let row = c
        .query_opt(
            "SELECT shard_name, state, target_shard, version FROM shard_directory.shard_directory \
             WHERE entity_type = $1 AND entity_id = $2",
            &[&key.entity_type, &key.entity_id],
        )
        .await?;
    row.map(|r| placement(&r, 0, key)).transpose()
}

/// The placement of `key` in columns `at..at + 4` of `r`: shard_name, state, target_shard,
/// version.
fn placement(r: &tokio_postgres::Row, at: usize, key: &EntityKey) -> Result<Placement, ReadError> {
    Ok(Placement {
        shard_name: r.get(at),
        state: state_of(key, r.get(at + 1))?,
        target_shard: r.get(at + 2),
        version: r.get(at + 3),
    })
}

/// The state `state` (the entry of `key`'s) spells.
fn state_of(key: &EntityKey, state: &str) -> Result<State, ReadError> {
    state.parse().map_err(|_| ReadError::UnknownState {
        entity: key.clone(),
        state: state.to_owned(),
    })
}

/// The entries of `ids` of `entity_type` that exist, by id.
pub(crate) async fn read_many(
    c: &impl GenericClient,
    entity_type: &str,
    ids: &[&str],
) -> Result<std::collections::HashMap<String, Placement>, ReadError> {
    let rows = c
        .query(
            "SELECT entity_id, shard_name, state, target_shard, version \
             FROM shard_directory.shard_directory WHERE entity_type = $1 AND entity_id = ANY ($2)",
            &[&entity_type, &ids],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let id: String = r.get(0);
            let placement = placement(r, 1, &EntityKey::new(entity_type, &id))?;
            Ok((id, placement))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A state this mover does not know (a newer extension's) is an error naming the entity and
    /// the state; it was taken as read_only.
    #[test]
    fn an_unknown_state_is_an_error_not_read_only() {
        let key = EntityKey::new("tenant", "8842");
        assert_eq!(state_of(&key, "read_only").unwrap(), State::ReadOnly);
        let read = state_of(&key, "paused").map(Some);
        let e = read.at(Step::Preflight, Place::Directory).unwrap_err();
        assert!(matches!(e, Error::UnknownState { .. }), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains("tenant/8842") && message.contains("\"paused\""),
            "{message}"
        );
    }
}
