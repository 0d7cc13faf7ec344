//! One shard as a move sees it: the session, the entity's tables there, and its fence.

pub(crate) mod catalog;
pub(crate) mod fence;
pub(crate) mod side;
