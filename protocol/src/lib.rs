//! The contract between the three parts of `shard_directory`: the PostgreSQL extension (on the
//! directory database and on every shard), the client crate that routes through it, and the
//! mover. What one of them writes and another reads is defined here once, as
//! `postgres-protocol` defines PostgreSQL's wire format for rust-postgres.
//!
//! - [`EntityKey`] (`entity`): `(entity_type, entity_id)`, the directory's key, shown as
//!   `tenant/8842`.
//! - [`State`] (`state`): an entry's routing state, spelled as `shard_directory.state` spells it.
//! - [`refusal`]: why a shard refused a transaction with SQLSTATE 40001, and the JSON object its
//!   DETAIL holds.
//! - [`setting`]: the settings a client sets in each transaction it routes, and the names of
//!   the extension's own.
//! - [`CHANNEL`], [`EPOCH_CHANNEL`], [`MOVES_CHANNEL`] and [`WATCHER_APPLICATION_NAME`] (`name`): the notification
//!   channels (versions, moves' phases) and the watcher's `application_name`.
//! - [`relay`] (feature `relay`): what `shard-directory relay` publishes to the clients.
//!
//! No dependencies; feature `serde` derives `Serialize` and `Deserialize`, feature `relay` adds
//! JSON and HMAC-SHA256.

#![warn(missing_docs)]

mod entity;
mod name;
pub mod refusal;
#[cfg(feature = "relay")]
pub mod relay;
pub mod setting;
mod state;

pub use entity::EntityKey;
pub use name::{Name, CHANNEL, EPOCH_CHANNEL, MOVES_CHANNEL, WATCHER_APPLICATION_NAME};
pub use state::{State, UnknownState};
