//! Reading a shard's 40001: the extension puts a JSON object in the DETAIL (the protocol's
//! `refusal::Detail`: `{..."moved_to":"shard_2","reason":"moved","version":42}`).

use std::fmt;

use shard_directory_protocol::refusal::{Detail, Reason};
use shard_directory_protocol::EntityKey;
use tokio_postgres::error::SqlState;

/// Why a shard refused a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The client's directory version is below the shard's (or the entity's) minimum.
    Stale {
        /// That minimum, when the shard said it.
        minimum: Option<i64>,
    },
    /// The transaction carried no directory version.
    Missing,
    /// The entity's cutover is running on this shard.
    Frozen,
    /// The entity now lives on `moved_to`, since directory version `version`.
    Moved {
        /// The shard the entity now lives on.
        moved_to: String,
        /// The directory version of the move: send at least this one to `moved_to`.
        version: i64,
        /// The entity the refusal is about, as the shard named it: a transaction routed for
        /// one entity may write another's row, and that entity's `moved_to` says nothing of
        /// where the routed one lives. (Boxed: every error of the client carries a rejection.)
        entity: Option<Box<EntityKey>>,
    },
    /// A plain serialization failure (no shard_directory DETAIL).
    Serialization,
    /// A refusal of shard_directory's whose reason this client does not know (a newer
    /// extension's, or one such as `truncate_fenced` that no re-routing cures): returned, not
    /// retried.
    Other(String),
}

impl Rejection {
    /// The label used in metrics and stats: the refusal's reason, or `serialization` and
    /// `other`.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::Stale { .. } => Reason::Stale.as_str(),
            Rejection::Missing => Reason::Missing.as_str(),
            Rejection::Frozen => Reason::Frozen.as_str(),
            Rejection::Moved { .. } => Reason::Moved.as_str(),
            Rejection::Serialization => "serialization",
            Rejection::Other(_) => "other",
        }
    }

    /// Whether the refusal is about another entity than `routed` (a row of that one, written in
    /// a transaction routed for `routed`): re-routing `routed` cures nothing then.
    pub fn about_another(&self, routed: &EntityKey) -> bool {
        matches!(self, Rejection::Moved { entity: Some(e), .. } if **e != *routed)
    }

    /// The rejection a database error carries, if it is a 40001.
    pub fn of(e: &tokio_postgres::Error) -> Option<Rejection> {
        let db = e.as_db_error()?;
        Rejection::from_error(db.code().code(), db.detail())
    }

    /// The rejection an error with SQLSTATE `sqlstate` and DETAIL `detail` carries, if it is a
    /// 40001: for a client on another driver (psycopg's `e.diag.sqlstate` and
    /// `e.diag.message_detail`).
    ///
    /// ```
    /// use shard_directory_client::Rejection;
    /// let detail = r#"{"reason":"moved","moved_to":"shard_2","version":42}"#;
    /// let moved = Rejection::from_error("40001", Some(detail)).unwrap();
    /// assert_eq!(moved.reason(), "moved");
    /// assert_eq!(Rejection::from_error("40001", None), Some(Rejection::Serialization));
    /// assert_eq!(Rejection::from_error("23505", Some(detail)), None);
    /// ```
    pub fn from_error(sqlstate: &str, detail: Option<&str>) -> Option<Rejection> {
        if sqlstate != SqlState::T_R_SERIALIZATION_FAILURE.code() {
            return None;
        }
        let detail: Option<Detail> = detail.and_then(|d| serde_json::from_str(d).ok());
        Some(match detail {
            Some(d) => match (d.reason(), d.moved_to, d.version) {
                (Some(Reason::Moved), Some(moved_to), Some(version)) => Rejection::Moved {
                    moved_to,
                    version,
                    entity: d
                        .entity_type
                        .zip(d.entity_id)
                        .map(|(t, i)| Box::new(EntityKey::new(t, i))),
                },
                (Some(Reason::Frozen), ..) => Rejection::Frozen,
                (Some(Reason::Missing), ..) => Rejection::Missing,
                (Some(Reason::Stale), ..) => Rejection::Stale {
                    minimum: d.min_accepted.or(d.min_version),
                },
                _ => Rejection::Other(d.reason),
            },
            None => Rejection::Serialization,
        })
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Moved {
                moved_to,
                version,
                entity,
            } => {
                if let Some(entity) = entity {
                    write!(f, "{entity} ")?;
                }
                write!(f, "moved to {moved_to} at version {version}")
            }
            Rejection::Stale {
                minimum: Some(minimum),
            } => write!(f, "stale (the shard requires directory version {minimum})"),
            Rejection::Other(reason) => write!(f, "{reason}"),
            other => f.write_str(other.reason()),
        }
    }
}
