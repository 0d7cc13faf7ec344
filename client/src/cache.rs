//! The in-process cache: entries tagged with the invalidation epoch they were filled in.
//!
//! An invalidation raises the known version and bumps the epoch; entries of an older epoch are
//! never served as current (they stay around only for the outage policy). A fill records the epoch
//! *before* it compares its version with the known one, so a fill that races an invalidation is
//! either refused or tagged with the old epoch: it is never served as current. The hit path is a
//! lock-free map read (papaya) and two atomic loads. "The directory has no entry for this key" is
//! cached the same way, so a client asked about unknown entities does not query for each. The
//! cache holds at most `max_entries`: past it, entries of older epochs go first, then any.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use crate::entry::{EntityKey, Entry};

struct Cached {
    /// `None`: the directory had no entry for the key.
    entry: Option<Arc<Entry>>,
    epoch: u64,
}

pub(crate) struct Cache {
    map: papaya::HashMap<EntityKey, Arc<Cached>>,
    version: AtomicI64,
    epoch: AtomicU64,
    max_entries: usize,
}

/// What the cache holds for a key.
pub(crate) enum Lookup {
    /// Filled since the latest invalidation; `None` when the directory has no entry for the key.
    Current(Option<Arc<Entry>>),
    /// Filled before the latest invalidation: only for serving during an outage.
    Stale(Arc<Entry>),
    Absent,
}

impl Cache {
    pub fn new(version: i64, max_entries: usize) -> Cache {
        Cache {
            map: papaya::HashMap::new(),
            version: AtomicI64::new(version),
            epoch: AtomicU64::new(0),
            max_entries: max_entries.max(1),
        }
    }

    pub fn version(&self) -> i64 {
        self.version.load(SeqCst)
    }

    /// What the cache holds for `key` (an [`EntityKey`] or a borrowed [`crate::entry::KeyRef`]).
    pub fn get<Q>(&self, key: &Q) -> Lookup
    where
        Q: papaya::Equivalent<EntityKey> + std::hash::Hash + ?Sized,
    {
        let epoch = self.epoch.load(SeqCst);
        match self.map.pin().get(key).map(|c| &**c) {
            Some(c) if c.epoch == epoch => Lookup::Current(c.entry.clone()),
            Some(Cached {
                entry: Some(entry), ..
            }) => Lookup::Stale(entry.clone()),
            _ => Lookup::Absent,
        }
    }

    /// Learns that the directory is at `version`; returns whether that was news.
    pub fn invalidate(&self, version: i64) -> bool {
        let previous = self.version.fetch_max(version, SeqCst);
        if previous < version {
            self.epoch.fetch_add(1, SeqCst);
            true
        } else {
            false
        }
    }

    /// The directory stands at `version`, below the `known` version this cache learned from it
    /// earlier: it was restored from a backup, or failed over to a standby that lost commits.
    /// Adopts `version` and retires every entry. Returns false when the known version moved
    /// meanwhile (the caller reads again).
    pub fn adopt_lower(&self, known: i64, version: i64) -> bool {
        if self
            .version
            .compare_exchange(known, version, SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
        self.epoch.fetch_add(1, SeqCst);
        true
    }

    /// Stores what a fetch of `key` read at directory version `read_at` (`None`: no entry), if
    /// nothing newer is known. Returns whether it was stored as current.
    pub fn fill(&self, key: &EntityKey, entry: Option<Arc<Entry>>, read_at: i64) -> bool {
        let epoch = self.epoch.load(SeqCst);
        if read_at < self.version() {
            return false;
        }
        let map = self.map.pin();
        map.insert(key.clone(), Arc::new(Cached { entry, epoch }));
        if map.len() > self.max_entries {
            self.shrink(epoch);
        }
        true
    }

    /// Brings the cache back under its bound: entries of older epochs first, then any, down to
    /// nine tenths of the bound so that a full cache does not shrink on every fill.
    fn shrink(&self, epoch: u64) {
        let map = self.map.pin();
        map.retain(|_, c| c.epoch == epoch);
        let target = self.max_entries - self.max_entries / 10;
        let excess = map.len().saturating_sub(target);
        let victims: Vec<EntityKey> = map.keys().take(excess).cloned().collect();
        for key in &victims {
            map.remove(key);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{KeyRef, State};

    fn fill(cache: &Cache, entry: Arc<Entry>) -> bool {
        let at = entry.directory_version;
        cache.fill(&entry.key.clone(), Some(entry), at)
    }

    fn entry(shard: &str, at: i64) -> Arc<Entry> {
        Arc::new(Entry {
            key: EntityKey::new("tenant", "1"),
            shard_name: shard.into(),
            target_shard: None,
            state: State::Active,
            region: None,
            version: at,
            directory_version: at,
        })
    }

    #[test]
    fn an_invalidation_retires_every_entry_filled_before_it() {
        let cache = Cache::new(1, 100);
        assert!(fill(&cache, entry("s1", 1)));
        assert!(
            matches!(cache.get(&EntityKey::new("tenant", "1")), Lookup::Current(Some(e)) if e.shard_name == "s1")
        );
        assert!(cache.invalidate(2));
        assert!(!cache.invalidate(2), "the same version twice is no news");
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Stale(_)
        ));
    }

    #[test]
    fn a_fill_read_before_the_known_version_is_refused() {
        let cache = Cache::new(1, 100);
        cache.invalidate(3);
        assert!(!fill(&cache, entry("s1", 2)));
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Absent
        ));
        assert!(fill(&cache, entry("s2", 3)));
    }

    #[test]
    fn a_lower_version_is_adopted_only_from_the_version_it_was_compared_with() {
        let cache = Cache::new(1, 100);
        cache.invalidate(9);
        assert!(fill(&cache, entry("s1", 9)));
        assert!(!cache.adopt_lower(8, 4), "the known version is 9, not 8");
        assert!(cache.adopt_lower(9, 4));
        assert_eq!(cache.version(), 4);
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Stale(_)
        ));
        assert!(fill(&cache, entry("s2", 4)));
    }

    #[test]
    fn unknown_entities_are_cached_and_retired_like_entries() {
        let cache = Cache::new(1, 100);
        let key = EntityKey::new("tenant", "nope");
        assert!(cache.fill(&key, None, 1));
        assert!(matches!(cache.get(&key), Lookup::Current(None)));
        cache.invalidate(2);
        assert!(matches!(cache.get(&key), Lookup::Absent));
    }

    #[test]
    fn the_cache_stays_within_its_bound_older_epochs_first() {
        let cache = Cache::new(1, 10);
        let key = |i: usize| EntityKey::new("tenant", i.to_string());
        for i in 0..5 {
            assert!(cache.fill(&key(i), None, 1));
        }
        cache.invalidate(2);
        for i in 5..11 {
            assert!(cache.fill(&key(i), None, 2));
        }
        // Over the bound: the five entries of the older epoch went, the six current ones stayed.
        assert_eq!(cache.len(), 6);
        assert!((5..11).all(|i| matches!(cache.get(&key(i)), Lookup::Current(None))));
        for i in 11..100 {
            cache.fill(&key(i), None, 2);
            assert!(cache.len() <= 10);
        }
    }

    /// Counts this thread's allocations, to show a hit by borrowed key makes none.
    struct Counting;

    thread_local! {
        static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
            unsafe { std::alloc::System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    #[test]
    fn a_hit_by_borrowed_key_finds_the_entry_and_allocates_nothing() {
        let cache = Cache::new(1, 100);
        assert!(fill(&cache, entry("shard_1", 1)));
        let borrowed = KeyRef {
            entity_type: "tenant",
            entity_id: "1",
        };
        let before = ALLOCATIONS.with(|n| n.get());
        let found =
            matches!(cache.get(&borrowed), Lookup::Current(Some(e)) if e.shard_name == "shard_1");
        let after = ALLOCATIONS.with(|n| n.get());
        assert!(found, "a borrowed key finds what an owned one filled");
        assert_eq!(after - before, 0, "allocations on a hit");
        let owned = borrowed.to_owned();
        assert!(
            ALLOCATIONS.with(|n| n.get()) > after,
            "the counter sees the key {owned} being made"
        );
        let other = KeyRef {
            entity_type: "tenant",
            entity_id: "2",
        };
        assert!(matches!(cache.get(&other), Lookup::Absent));
    }
}
