//! Where an entry is and where it is going: the part of an entry the move state machine rules.

use std::fmt;

pub use shard_directory_protocol::State;

/// Where an entry is and where it is going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub state: State,
    pub shard_name: String,
    pub target_shard: Option<String>,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target_shard {
            None => write!(f, "{} on {}", self.state, self.shard_name),
            Some(t) => write!(f, "{} on {} (target {t})", self.state, self.shard_name),
        }
    }
}
