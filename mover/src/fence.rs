//! An entity's fence on one shard, read and written through the extension's functions. A move
//! records both sides' fences before it changes them, so that an abort can put them back.

use serde::{Deserialize, Serialize};
use shard_directory_client::EntityKey;
use tokio_postgres::Client;

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
