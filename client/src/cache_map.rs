//! The map under the cache, with only the operations the cache needs: a read, an update from the
//! old value, removals. It is papaya's lock-free map. The cache writes it one writer at a time
//! (in its writers' turn) and reads it without a turn. In the loom model of the cache
//! (`--cfg sd_loom`, `scripts/test.sh`) it is a map behind loom's mutex instead, each operation
//! one step that loom orders against the cache's atomics in every way. That is what the model
//! explores, and it is faithful only because writes never race: with racing writers, papaya's
//! `compute` is not one step ([`Pinned::update`]). Papaya's insides are papaya's to test.

use crate::cache_key::CacheKey;
use crate::entry::KeyRef;

#[cfg(not(sd_loom))]
pub(crate) struct Map<V>(papaya::HashMap<CacheKey, V, foldhash::fast::RandomState>);

#[cfg(not(sd_loom))]
pub(crate) struct Pinned<'m, V>(
    papaya::HashMapRef<'m, CacheKey, V, foldhash::fast::RandomState, seize::LocalGuard<'m>>,
);

#[cfg(not(sd_loom))]
impl<V: Copy + Send + Sync> Map<V> {
    pub fn new() -> Map<V> {
        Map(papaya::HashMap::builder()
            // foldhash (seeded per process): a third of SipHash's cost on the hit path.
            .hasher(foldhash::fast::RandomState::default())
            // Incremental resizing (papaya's default) leaves a resize half done when fills stop,
            // and every hit then searches two tables; a blocking resize costs the rare fill
            // that triggers it instead.
            .resize_mode(papaya::ResizeMode::Blocking)
            // Retired tables freed when retired, not once 32 retirements have gathered: a cache
            // that fills and then only reads would otherwise keep every table it outgrew (19 B
            // per entry at 1M). Retirements are rare (marks, refills).
            .collector(seize::Collector::new().batch_size(1))
            .build())
    }

    /// A view for several operations: papaya's guard is entered once for all of them.
    pub fn pin(&self) -> Pinned<'_, V> {
        Pinned(self.0.pin())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(not(sd_loom))]
impl<V: Copy + Send + Sync> Pinned<'_, V> {
    pub fn get(&self, key: KeyRef<'_>) -> Option<V> {
        self.0.get(&key).copied()
    }

    /// Stores what `make` returns from the key's value (`None`: leaves it as it is). `make` may
    /// run more than once, and papaya may store a value `make` returned for an absent key after
    /// the key was inserted and removed meanwhile, without calling it again: a check made in
    /// `make` holds at the store only when nobody else writes. Returns whether it stored.
    pub fn update(&self, key: CacheKey, mut make: impl FnMut(Option<&V>) -> Option<V>) -> bool {
        let done = self.0.compute(key, |old| match make(old.map(|(_, v)| v)) {
            Some(v) => papaya::Operation::Insert(v),
            None => papaya::Operation::Abort(()),
        });
        matches!(
            done,
            papaya::Compute::Inserted(..) | papaya::Compute::Updated { .. }
        )
    }

    pub fn retain(&self, mut keep: impl FnMut(&V) -> bool) {
        self.0.retain(|_, v| keep(v));
    }

    /// Up to `n` keys, in no particular order.
    pub fn some_keys(&self, n: usize) -> Vec<CacheKey> {
        self.0.keys().take(n).cloned().collect()
    }

    pub fn remove(&self, key: &CacheKey) {
        self.0.remove(key);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(sd_loom)]
pub(crate) struct Map<V>(loom::sync::Mutex<std::collections::HashMap<CacheKey, V>>);

#[cfg(sd_loom)]
pub(crate) struct Pinned<'m, V>(&'m Map<V>);

#[cfg(sd_loom)]
impl<V: Copy + Send + Sync> Map<V> {
    pub fn new() -> Map<V> {
        Map(loom::sync::Mutex::new(std::collections::HashMap::new()))
    }

    pub fn pin(&self) -> Pinned<'_, V> {
        Pinned(self)
    }

    pub fn len(&self) -> usize {
        self.locked().len()
    }

    fn locked(&self) -> loom::sync::MutexGuard<'_, std::collections::HashMap<CacheKey, V>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(sd_loom)]
impl<V: Copy + Send + Sync> Pinned<'_, V> {
    pub fn get(&self, key: KeyRef<'_>) -> Option<V> {
        self.0.locked().get(&CacheKey::from(key)).copied()
    }

    pub fn update(&self, key: CacheKey, mut make: impl FnMut(Option<&V>) -> Option<V>) -> bool {
        let mut map = self.0.locked();
        match make(map.get(&key)) {
            Some(v) => {
                map.insert(key, v);
                true
            }
            None => false,
        }
    }

    pub fn retain(&self, mut keep: impl FnMut(&V) -> bool) {
        self.0.locked().retain(|_, v| keep(v));
    }

    pub fn some_keys(&self, n: usize) -> Vec<CacheKey> {
        self.0.locked().keys().take(n).cloned().collect()
    }

    pub fn remove(&self, key: &CacheKey) {
        self.0.locked().remove(key);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}
