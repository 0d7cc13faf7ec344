//! A shard's refusal: SQLSTATE 40001 (a client retries it), with one JSON object in the DETAIL
//! saying why (the shard's `stats()` counts refusals by the same reasons).
//!
//! ```text
//! {"client_version":41,"min_accepted":42,"reason":"stale"}
//! {"client_version":null,"min_accepted":0,"reason":"missing"}
//! {"client_version":41,"entity_id":"8842","entity_type":"tenant","min_version":42,"reason":"stale"}
//! {"entity_id":"8842","entity_type":"tenant","reason":"frozen"}
//! {"client_version":41,"entity_id":"8842","entity_type":"tenant","moved_to":"shard_2","reason":"moved","version":42}
//! {"entity_id":"8842","entity_type":"tenant","fence":"moved","reason":"truncate_fenced"}
//! ```

use std::fmt;

/// Why a shard refused: the DETAIL's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The client's directory version is below the shard's minimum, or the entity's.
    Stale,
    /// The transaction carried no directory version.
    Missing,
    /// The entity's cutover is running on this shard: retry after a short backoff.
    Frozen,
    /// The entity lives on `moved_to` since directory version `version`.
    Moved,
    /// A TRUNCATE would remove the rows of an entity fenced frozen or moved: no re-routing
    /// cures it.
    TruncateFenced,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 5] = [
        Reason::Stale,
        Reason::Missing,
        Reason::Frozen,
        Reason::Moved,
        Reason::TruncateFenced,
    ];

    /// As the DETAIL spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Stale => "stale",
            Reason::Missing => "missing",
            Reason::Frozen => "frozen",
            Reason::Moved => "moved",
            Reason::TruncateFenced => "truncate_fenced",
        }
    }

    /// The reason `s` spells, if it is one of these (a newer extension may send others).
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The DETAIL of a refusal: which fields a reason fills is in the module's examples. Fields in
/// the order they are written (alphabetical); an absent one is not written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Detail {
    /// The version the client sent: written (`null` when it sent none) for `stale`, `missing`
    /// and `moved`.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub client_version: Option<Option<i64>>,
    /// The entity's id, when the refusal is about one entity.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub entity_id: Option<String>,
    /// The entity's type, with `entity_id`.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub entity_type: Option<String>,
    /// The fence a `truncate_fenced` met (`frozen` or `moved`).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub fence: Option<String>,
    /// The shard's minimum (`stale` or `missing` without an entity).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub min_accepted: Option<i64>,
    /// The entity's minimum (`stale` for an entity).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub min_version: Option<i64>,
    /// Where a `moved` entity lives now.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub moved_to: Option<String>,
    /// A [`Reason`]'s text (kept as text: a newer extension may send a reason this crate does
    /// not know).
    pub reason: String,
    /// The directory version of a `moved` entity's move: route to `moved_to` with at least it.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub version: Option<i64>,
}

impl Detail {
    /// A DETAIL for `reason` with nothing else filled in.
    pub fn new(reason: Reason) -> Detail {
        Detail {
            reason: reason.as_str().to_owned(),
            ..Detail::default()
        }
    }

    /// The reason, if this crate knows it.
    pub fn reason(&self) -> Option<Reason> {
        Reason::parse(&self.reason)
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    fn entity(reason: Reason) -> Detail {
        Detail {
            entity_type: Some("tenant".into()),
            entity_id: Some("8842".into()),
            ..Detail::new(reason)
        }
    }

    /// What a DBA and a client read in a refusal's DETAIL: the module's examples, exactly.
    #[test]
    fn each_refusal_is_written_as_documented_and_read_back() {
        let details = [
            Detail {
                client_version: Some(Some(41)),
                min_accepted: Some(42),
                ..Detail::new(Reason::Stale)
            },
            Detail {
                client_version: Some(None),
                min_accepted: Some(0),
                ..Detail::new(Reason::Missing)
            },
            Detail {
                client_version: Some(Some(41)),
                min_version: Some(42),
                ..entity(Reason::Stale)
            },
            entity(Reason::Frozen),
            Detail {
                client_version: Some(Some(41)),
                moved_to: Some("shard_2".into()),
                version: Some(42),
                ..entity(Reason::Moved)
            },
            Detail {
                fence: Some("moved".into()),
                ..entity(Reason::TruncateFenced)
            },
        ];
        let documented: Vec<&str> = include_str!("refusal.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! {"))
            .collect();
        assert_eq!(documented.len(), details.len());
        for (detail, text) in details.iter().zip(documented) {
            let json = serde_json::to_string(detail).unwrap();
            assert_eq!(json, format!("{{{text}"));
            let read: Detail = serde_json::from_str(&json).unwrap();
            assert_eq!(read.reason(), detail.reason());
            assert_eq!(
                (&read.moved_to, read.version),
                (&detail.moved_to, detail.version)
            );
        }
        // A reason a newer extension sends is still read, as text.
        let newer: Detail = serde_json::from_str(r#"{"reason":"paused"}"#).unwrap();
        assert_eq!((newer.reason(), newer.reason.as_str()), (None, "paused"));
    }
}
