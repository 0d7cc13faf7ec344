//! The settings that carry a client's routing to a shard, and the extension's own.
//!
//! A client sets the first three in each transaction it routes to a shard
//! (`set_config(name, value, true)`); the shard's check reads them.

use crate::Name;

/// The directory version the client routed the transaction with.
pub const DIRECTORY_VERSION: Name = Name::new(c"app.directory_version");

/// The type of the entity the transaction works on (set with [`ENTITY_ID`], or neither).
pub const ENTITY_TYPE: Name = Name::new(c"app.entity_type");

/// The id of the entity the transaction works on (set with [`ENTITY_TYPE`], or neither).
pub const ENTITY_ID: Name = Name::new(c"app.entity_id");

/// A DBA's emergency permission to re-point an entry directly (directory; SET LOCAL).
pub const ALLOW_REPOINT: Name = Name::new(c"shard_directory.allow_repoint");

/// How long a fence change waits for the shard's checked transactions in flight, in
/// milliseconds (shard).
pub const FENCE_WAIT_TIMEOUT: Name = Name::new(c"shard_directory.fence_wait_timeout");

/// Whether the shard counts each entity's checked transactions for `entity_stats()` (shard).
pub const ENTITY_STATS: Name = Name::new(c"shard_directory.entity_stats");

/// The window `entity_stats()` counts over, in seconds (shard).
pub const ENTITY_STATS_WINDOW: Name = Name::new(c"shard_directory.entity_stats_window");
