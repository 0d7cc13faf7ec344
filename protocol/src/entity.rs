//! The directory's key.

use std::fmt;

/// `(entity_type, entity_id)`: what the directory maps to a shard. `entity_id` is the canonical
/// text of the entity's key column on its shards (`8842`, not `08842`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EntityKey {
    /// What kind of entity: `tenant`, `account`, `region`, ...
    pub entity_type: String,
    /// Its identifier, as text.
    pub entity_id: String,
}

impl EntityKey {
    /// ```
    /// let key = shard_directory_protocol::EntityKey::new("tenant", "8842");
    /// assert_eq!(key.to_string(), "tenant/8842");
    /// ```
    pub fn new(entity_type: impl Into<String>, entity_id: impl Into<String>) -> Self {
        EntityKey {
            entity_type: entity_type.into(),
            entity_id: entity_id.into(),
        }
    }
}

impl fmt::Display for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.entity_type, self.entity_id)
    }
}
