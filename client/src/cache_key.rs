//! The cache's own key: an entity's type and id in one buffer, inline when short (as most keys
//! are). A hit compares it where the map's node already is, without following the two pointers
//! of an [`EntityKey`]'s strings, and a cached entry keeps no second heap copy of its key.

use std::hash::{Hash, Hasher};

use crate::entry::{AsKeyRef, EntityKey, KeyRef};

/// Bytes kept inline: `tenant` and an id of up to 24 bytes fit.
const INLINE: usize = 30;

#[derive(Clone, PartialEq, Eq)]
enum Bytes {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
}

/// `entity_type` then `entity_id`, `split` bytes apart.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct CacheKey {
    split: u32,
    bytes: Bytes,
}

impl CacheKey {
    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Inline(len, buf) => &buf[..*len as usize],
            Bytes::Heap(b) => b,
        }
    }

    fn parts(&self) -> (&str, &str) {
        let (t, id) = self.bytes().split_at(self.split as usize);
        // Both halves were whole `str`s when the key was made.
        (
            std::str::from_utf8(t).expect("UTF-8"),
            std::str::from_utf8(id).expect("UTF-8"),
        )
    }

    pub fn as_ref(&self) -> KeyRef<'_> {
        let (entity_type, entity_id) = self.parts();
        KeyRef {
            entity_type,
            entity_id,
        }
    }
}

impl From<KeyRef<'_>> for CacheKey {
    fn from(k: KeyRef<'_>) -> CacheKey {
        let len = k.entity_type.len() + k.entity_id.len();
        let bytes = if len <= INLINE {
            let mut buf = [0; INLINE];
            buf[..k.entity_type.len()].copy_from_slice(k.entity_type.as_bytes());
            buf[k.entity_type.len()..len].copy_from_slice(k.entity_id.as_bytes());
            Bytes::Inline(len as u8, buf)
        } else {
            Bytes::Heap(
                [k.entity_type.as_bytes(), k.entity_id.as_bytes()]
                    .concat()
                    .into(),
            )
        };
        CacheKey {
            split: u32::try_from(k.entity_type.len()).expect("an entity type under 4 GiB"),
            bytes,
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
        let bytes = key.bytes();
        let split = key.split as usize;
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
        assert!(matches!(a.bytes, Bytes::Inline(..)));
        assert!(matches!(
            CacheKey::from(KeyRef {
                entity_type: "tenant",
                entity_id: &long
            })
            .bytes,
            Bytes::Heap(_)
        ));
    }
}
