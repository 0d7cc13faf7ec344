//! Names both PostgreSQL (as C strings) and clients (as text) use.

use std::ffi::CStr;
use std::fmt;

/// A name PostgreSQL's C functions take as a C string and clients send as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Name(&'static CStr);

impl Name {
    /// `name`, which must be ASCII.
    pub const fn new(name: &'static CStr) -> Name {
        assert!(name.to_bytes().is_ascii(), "a name is ASCII");
        Name(name)
    }

    /// As text.
    pub const fn as_str(self) -> &'static str {
        match self.0.to_str() {
            Ok(name) => name,
            Err(_) => panic!("a name is ASCII"),
        }
    }

    /// As a C string.
    pub const fn as_c_str(self) -> &'static CStr {
        self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The channel the directory notifies each move's new phase on, as a move's record enters it:
/// a JSON object with `move_id`, `entity_type`, `entity_id`, `source_shard`, `target_shard` and
/// `phase`, delivered when the transaction that wrote the phase commits.
pub const MOVES_CHANNEL: Name = Name::new(c"shard_directory_moves");

/// The channel the directory notifies each new version on (`pg_notify(CHANNEL, version)`), and
/// that watchers `LISTEN` to. The payload is the version, as text.
pub const CHANNEL: Name = Name::new(c"shard_directory");

/// The channel the directory notifies a new epoch on, with the version that begins it: the first
/// change made by a copy of the directory other than the one that minted its lineage (a restart,
/// a restore, a promoted standby) mints a new one. The payload is `<version> <epoch>`, queued
/// before that version's notification on [`CHANNEL`], which names no epoch (and stays readable as
/// a plain version): a watcher that hears a version learns which history it belongs to.
pub const EPOCH_CHANNEL: Name = Name::new(c"shard_directory_epoch");

/// The `application_name` of the client's watcher connection: what its directory session shows
/// in `pg_stat_activity`.
pub const WATCHER_APPLICATION_NAME: &str = "shard_directory_watcher";
