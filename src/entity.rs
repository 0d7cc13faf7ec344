//! The identity both roles talk about: `(entity_type, entity_id)` (the protocol's
//! [`EntityKey`]), as SQL functions take it and as the check borrows it.

pub use shard_directory_protocol::EntityKey;

use crate::error::required;

/// The key a SQL function's `(entity_type, entity_id)` arguments name; NULL is an error.
pub fn key_of(entity_type: Option<&str>, entity_id: Option<&str>) -> EntityKey {
    EntityKey::new(
        required(entity_type, "entity_type"),
        required(entity_id, "entity_id"),
    )
}

/// An entity named by borrowed strings: the check looks fences up without allocating, and makes
/// an `EntityKey` only to refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntityRef<'a> {
    pub entity_type: &'a str,
    pub entity_id: &'a str,
}

impl EntityRef<'_> {
    pub fn to_key(self) -> EntityKey {
        EntityKey {
            entity_type: self.entity_type.to_owned(),
            entity_id: self.entity_id.to_owned(),
        }
    }
}

impl<'a> From<&'a EntityKey> for EntityRef<'a> {
    fn from(key: &'a EntityKey) -> EntityRef<'a> {
        EntityRef {
            entity_type: &key.entity_type,
            entity_id: &key.entity_id,
        }
    }
}

/// Refuses to install the extension in a database whose encoding is not UTF8: the check, the
/// fences and the mover compare entity ids as UTF-8 text, and in another encoding an id that a
/// client sends, a fence holds and a row's key prints could differ byte for byte.
#[pgrx::pg_extern(volatile)]
fn require_utf8_database() {
    let encoding = unsafe { pgrx::pg_sys::GetDatabaseEncoding() };
    if encoding != pgrx::pg_sys::pg_enc::PG_UTF8 as i32 {
        let name = unsafe { std::ffi::CStr::from_ptr(pgrx::pg_sys::GetDatabaseEncodingName()) };
        crate::error::SdError::DatabaseEncoding {
            encoding: name.to_string_lossy().into_owned(),
        }
        .raise();
    }
}
