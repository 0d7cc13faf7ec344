//! The cache's own key: an entity's type and id in one buffer, inline when short (as most keys
//! are), in 24 bytes. A hit compares it where the map's node already is, without following the two pointers
//! of an [`EntityKey`]'s strings, and a cached entry keeps no second heap copy of its key.

use std::hash::{Hash, Hasher};

use crate::entry::{AsKeyRef, EntityKey, KeyRef};

/// Bytes kept inline: `tenant` and an id of up to 15 bytes fit, and the key stays 24 bytes.
const INLINE: usize = 21;

/// `entity_type` then `entity_id`, `split` bytes apart.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum CacheKey {
    Inline {
        split: u8,
        len: u8,
        buf: [u8; INLINE],
    },
    Heap {
        split: u32,
        bytes: Box<[u8]>,
    },
}

impl CacheKey {
    fn bytes(&self) -> (&[u8], usize) {
        match self {
            CacheKey::Inline { split, len, buf } => (&buf[..*len as usize], *split as usize),
            CacheKey::Heap { split, bytes } => (bytes, *split as usize),
        }
    }

    pub fn as_ref(&self) -> KeyRef<'_> {
        let (bytes, split) = self.bytes();
        let (t, id) = bytes.split_at(split);
        // Both halves were whole `str`s when the key was made.
        KeyRef {
            entity_type: std::str::from_utf8(t).expect("UTF-8"),
            entity_id: std::str::from_utf8(id).expect("UTF-8"),
        }
    }
}

impl From<KeyRef<'_>> for CacheKey {
    fn from(k: KeyRef<'_>) -> CacheKey {
        let (t, id) = (k.entity_type.as_bytes(), k.entity_id.as_bytes());
        let len = t.len() + id.len();
        if len <= INLINE {
            let mut buf = [0; INLINE];
            buf[..t.len()].copy_from_slice(t);
            buf[t.len()..len].copy_from_slice(id);
            CacheKey::Inline {
                split: t.len() as u8,
                len: len as u8,
                buf,
            }
        } else {
            CacheKey::Heap {
                split: u32::try_from(t.len()).expect("an entity type under 4 GiB"),
                bytes: [t, id].concat().into(),
            }
        }
    }
}

impl From<&EntityKey> for CacheKey {
    fn from(k: &EntityKey) -> CacheKey {
        CacheKey::from(k.key_ref())
    }
}

/// As a [`KeyRef`] hashes (field by field, each as a `str`), so that one finds the other.
impl Hash for CacheKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state)
    }
}

impl papaya::Equivalent<CacheKey> for KeyRef<'_> {
    fn equivalent(&self, key: &CacheKey) -> bool {
        let (bytes, split) = key.bytes();
        split == self.entity_type.len()
            && bytes.len() == split + self.entity_id.len()
            && &bytes[..split] == self.entity_type.as_bytes()
            && &bytes[split..] == self.entity_id.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn short_and_long_keys_round_trip_hash_as_their_borrowed_form_and_do_not_collide_by_split() {
        let hasher = foldhash::fast::RandomState::default();
        let long = "x".repeat(100);
        for (t, id) in [
            ("tenant", "8842"),
            ("tenant", long.as_str()),
            ("", ""),
            ("ab", "c"),
        ] {
            let borrowed = KeyRef {
                entity_type: t,
                entity_id: id,
            };
            let key = CacheKey::from(KeyRef {
                entity_type: t,
                entity_id: id,
            });
            assert_eq!(key.as_ref().entity_type, t);
            assert_eq!(key.as_ref().entity_id, id);
            assert!(papaya::Equivalent::equivalent(&borrowed, &key));
            assert_eq!(hasher.hash_one(&borrowed), hasher.hash_one(&key));
        }
        // Same bytes, another split: another key.
        let a = CacheKey::from(KeyRef {
            entity_type: "ab",
            entity_id: "c",
        });
        let b = KeyRef {
            entity_type: "a",
            entity_id: "bc",
        };
        assert!(!papaya::Equivalent::equivalent(&b, &a));
        assert!(matches!(a, CacheKey::Inline { .. }));
        assert_eq!(std::mem::size_of::<CacheKey>(), 24);
        assert!(matches!(
            CacheKey::from(KeyRef {
                entity_type: "tenant",
                entity_id: &long
            }),
            CacheKey::Heap { .. }
        ));
    }
}
