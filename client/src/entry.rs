//! What the directory says about one entity.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::name::Name;

/// `(entity_type, entity_id)`: the directory's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EntityKey {
    /// What kind of entity: `tenant`, `account`, `region`, ...
    pub entity_type: String,
    /// Its identifier, as text.
    pub entity_id: String,
}

impl EntityKey {
    /// ```
    /// let key = shard_directory_client::EntityKey::new("tenant", "8842");
    /// assert_eq!(key.to_string(), "tenant/8842");
    /// ```
    pub fn new(entity_type: impl Into<String>, entity_id: impl Into<String>) -> Self {
        EntityKey {
            entity_type: entity_type.into(),
            entity_id: entity_id.into(),
        }
    }
}

/// An [`EntityKey`] borrowed from two `&str`: a cache hit looks up with it and allocates
/// nothing. Hashes as the cache's key does (`crate::cache_key`).
#[derive(Hash)]
pub(crate) struct KeyRef<'a> {
    pub entity_type: &'a str,
    pub entity_id: &'a str,
}

impl KeyRef<'_> {
    pub fn to_owned(&self) -> EntityKey {
        EntityKey::new(self.entity_type, self.entity_id)
    }
}

/// What the cache can be asked by: an owned key or a borrowed one.
pub(crate) trait AsKeyRef {
    fn key_ref(&self) -> KeyRef<'_>;
}

impl AsKeyRef for EntityKey {
    fn key_ref(&self) -> KeyRef<'_> {
        KeyRef {
            entity_type: &self.entity_type,
            entity_id: &self.entity_id,
        }
    }
}

impl AsKeyRef for KeyRef<'_> {
    fn key_ref(&self) -> KeyRef<'_> {
        KeyRef {
            entity_type: self.entity_type,
            entity_id: self.entity_id,
        }
    }
}

impl fmt::Display for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.entity_type, self.entity_id)
    }
}

/// The entry's routing state, as in `shard_directory.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum State {
    /// Reads and writes go to `shard_name`.
    Active,
    /// Being copied to `target_shard`: reads go to both, writes to `shard_name`.
    Migrating,
    /// Cutover (or maintenance) running: writes are refused, retryably.
    ReadOnly,
}

impl State {
    /// As `shard_directory.state` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Migrating => "migrating",
            State::ReadOnly => "read_only",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `state` value this crate does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown directory entry state \"{0}\"")]
pub struct UnknownState(pub String);

impl std::str::FromStr for State {
    type Err = UnknownState;

    /// ```
    /// use shard_directory_client::State;
    /// assert_eq!("read_only".parse::<State>(), Ok(State::ReadOnly));
    /// assert!("paused".parse::<State>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<State, UnknownState> {
        [State::Active, State::Migrating, State::ReadOnly]
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// One directory entry, as read at `directory_version`. Small and `Copy`: a cache hit hands out
/// a copy, with no allocation and no reference count; the caller knows the key it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Entry {
    /// The shard that holds the entity (the source, during a move).
    pub shard_name: Name,
    /// Where a `migrating` / `read_only` entry is going.
    pub target_shard: Option<Name>,
    /// How to route it.
    pub state: State,
    /// The entity's region, if the directory records one.
    pub region: Option<Name>,
    /// The version that last changed this entry (`shard_directory.version`).
    pub version: i64,
    /// The global directory version this entry was read at: what the client sends to shards.
    pub directory_version: i64,
}
