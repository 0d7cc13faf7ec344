//! The identity both roles talk about: `(entity_type, entity_id)`.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntityKey {
    pub entity_type: String,
    pub entity_id: String,
}

impl fmt::Display for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.entity_type, self.entity_id)
    }
}
