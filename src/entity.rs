//! The identity both roles talk about: `(entity_type, entity_id)`.

use std::fmt;

use crate::error::required;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntityKey {
    pub entity_type: String,
    pub entity_id: String,
}

impl EntityKey {
    /// From a SQL function's `(entity_type, entity_id)` arguments; NULL is an error.
    pub fn from_args(entity_type: Option<&str>, entity_id: Option<&str>) -> EntityKey {
        EntityKey {
            entity_type: required(entity_type, "entity_type").to_owned(),
            entity_id: required(entity_id, "entity_id").to_owned(),
        }
    }
}

impl fmt::Display for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.entity_type, self.entity_id)
    }
}
