//! Interned names. A shard, a region or an entity type is spelled by few distinct strings that
//! many entries share. Interned once, a name is a thin pointer: a cached entry holds its names
//! inline, and a hit copies them without allocating or touching a reference count (which two
//! threads hitting entries on the same shard would fight over).
//!
//! An interned string lives as long as the process: the cost is bounded by the distinct names
//! the process sees (its shards and regions), not by the entries it caches.

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{LazyLock, Mutex, PoisonError};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

static NAMES: LazyLock<Mutex<HashMap<&'static str, Name>>> = LazyLock::new(Mutex::default);

/// A shard's or a region's name, as the directory spells it: compares and derefs as a `str`.
///
/// ```
/// use shard_directory_client::Name;
/// let a = Name::new("shard_1");
/// assert_eq!(a, "shard_1");
/// assert_eq!(a, Name::new(&String::from("shard_1")));
/// assert_eq!(a.len(), 7);
/// ```
#[derive(Clone, Copy)]
pub struct Name(&'static &'static str);

impl Name {
    /// The one `Name` spelled `s`. Takes a process-wide lock: made when an entry is read from the
    /// directory, never on a cache hit.
    pub fn new(s: &str) -> Name {
        let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(name) = names.get(s) {
            return *name;
        }
        let text: &'static str = Box::leak(s.into());
        let name = Name(Box::leak(Box::new(text)));
        names.insert(text, name);
        name
    }

    /// The name as a `str`, for as long as the process runs.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl std::ops::Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.0
    }
}

/// Interned: one spelling, one pointer.
impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Name {}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name::new(s)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Name::new(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spelling_is_one_name_and_round_trips_through_json() {
        let a = Name::new("shard_a");
        let owned = String::from("shard_a");
        let b = Name::new(&owned);
        assert!(std::ptr::eq(a.0, b.0), "interned once");
        assert_ne!(a, Name::new("shard_b"));
        assert_eq!(std::mem::size_of::<Option<Name>>(), 8);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"shard_a\"");
        assert_eq!(serde_json::from_str::<Name>(&json).unwrap(), a);
        assert_eq!(format!("{a} {a:?}"), "shard_a \"shard_a\"");
    }
}
