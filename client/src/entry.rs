//! What the directory says about one entity.

use serde::{Deserialize, Serialize};

use crate::name::Name;

pub use shard_directory_protocol::EntityKey;

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

pub use shard_directory_protocol::{State, UnknownState};

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
