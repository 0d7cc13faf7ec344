//! What the mover reads and writes in the directory database: the shards' registry, an entity's
//! entry, and each move's record with its phase.

pub(crate) mod entry;
pub(crate) mod phase;
pub(crate) mod record;
pub(crate) mod registry;
