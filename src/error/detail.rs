//! The DETAIL of an error: a refusal's one JSON object (the protocol's `refusal::Detail`, which
//! clients parse), and what the shard's `stats()` counts a refusal as.

use shard_directory_protocol::refusal::{Detail, Reason};
use shard_directory_protocol::EntityKey;

use super::SdError;

/// What `stats()` counts a refused request as: a refusal's reason (the protocol's, as the
/// client reads it in the DETAIL), or a client's bad setting (22023).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    Refused(Reason),
    Invalid,
}

impl Rejection {
    pub const ALL: [Rejection; 6] = [
        Rejection::Refused(Reason::Stale),
        Rejection::Refused(Reason::Missing),
        Rejection::Refused(Reason::Frozen),
        Rejection::Refused(Reason::Moved),
        Rejection::Refused(Reason::TruncateFenced),
        Rejection::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Refused(reason) => reason.as_str(),
            Rejection::Invalid => "invalid",
        }
    }
}

impl SdError {
    /// The rejection a shard-side check counts this error as, if it is one.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            Self::StaleDirectory { client: None, .. } => Some(Rejection::Refused(Reason::Missing)),
            Self::StaleDirectory { .. } | Self::StaleEntity { .. } => {
                Some(Rejection::Refused(Reason::Stale))
            }
            Self::EntityFrozen { .. } => Some(Rejection::Refused(Reason::Frozen)),
            Self::EntityMoved { .. } => Some(Rejection::Refused(Reason::Moved)),
            Self::TruncateFenced { .. } => Some(Rejection::Refused(Reason::TruncateFenced)),
            Self::InvalidSetting { .. } | Self::PartialEntity { .. } => Some(Rejection::Invalid),
            _ => None,
        }
    }

    pub fn detail(&self) -> Option<String> {
        let of = |entity: &EntityKey, reason| Detail {
            entity_type: Some(entity.entity_type.clone()),
            entity_id: Some(entity.entity_id.clone()),
            ..Detail::new(reason)
        };
        // The DETAIL of a refusal is one JSON object, for clients to parse (the protocol's).
        let refusal = match self {
            Self::StaleDirectory { client, minimum } => Some(Detail {
                client_version: Some(*client),
                min_accepted: Some(*minimum),
                ..Detail::new(if client.is_some() {
                    Reason::Stale
                } else {
                    Reason::Missing
                })
            }),
            Self::StaleEntity {
                entity,
                client,
                minimum,
            } => Some(Detail {
                client_version: Some(*client),
                min_version: Some(*minimum),
                ..of(entity, Reason::Stale)
            }),
            Self::EntityFrozen { entity } => Some(of(entity, Reason::Frozen)),
            Self::EntityMoved {
                entity,
                moved_to,
                version,
                client,
            } => Some(Detail {
                client_version: Some(*client),
                moved_to: Some(moved_to.clone()),
                version: Some(*version),
                ..of(entity, Reason::Moved)
            }),
            Self::TruncateFenced { entity, fence, .. } => Some(Detail {
                fence: Some((*fence).to_owned()),
                ..of(entity, Reason::TruncateFenced)
            }),
            _ => None,
        };
        if let Some(detail) = refusal {
            return Some(serde_json::to_string(&detail).expect("a refusal serializes"));
        }
        match self {
            Self::InvalidTransition { from, to, .. } => Some(format!(
                "The move state machine has no step from {} to {} with this shard and target.",
                from.state, to.state
            )),
            Self::RegionMismatch { .. } => {
                Some("Where both the entry and its shard have a region, they must match.".into())
            }
            _ => None,
        }
    }
}
