//! The in-process cache: entries tagged with the invalidation epoch they were filled in.
//!
//! An invalidation raises the known version and bumps the epoch; entries of an older epoch are
//! never served as current (they stay around only for the outage policy). A fill records the epoch
//! *before* it compares its version with the known one, so a fill that races an invalidation is
//! either refused or tagged with the old epoch: it is never served as current. The hit path is a
//! lock-free map read (papaya) and two atomic loads.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use crate::entry::{EntityKey, Entry};

struct Cached {
    entry: Arc<Entry>,
    epoch: u64,
}

pub(crate) struct Cache {
    map: papaya::HashMap<EntityKey, Arc<Cached>>,
    version: AtomicI64,
    epoch: AtomicU64,
}

/// What the cache holds for a key.
pub(crate) enum Lookup {
    Current(Arc<Entry>),
    /// Filled before the latest invalidation: only for serving during an outage.
    Stale(Arc<Entry>),
    Absent,
}

impl Cache {
    pub fn new(version: i64) -> Cache {
        Cache {
            map: papaya::HashMap::new(),
            version: AtomicI64::new(version),
            epoch: AtomicU64::new(0),
        }
    }

    pub fn version(&self) -> i64 {
        self.version.load(SeqCst)
    }

    pub fn get(&self, key: &EntityKey) -> Lookup {
        let epoch = self.epoch.load(SeqCst);
        match self.map.pin().get(key) {
            Some(c) if c.epoch == epoch => Lookup::Current(c.entry.clone()),
            Some(c) => Lookup::Stale(c.entry.clone()),
            None => Lookup::Absent,
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

    /// Stores what a fetch read at `entry.directory_version`, if nothing newer is known. Returns
    /// whether it was stored as current.
    pub fn fill(&self, entry: Arc<Entry>) -> bool {
        let epoch = self.epoch.load(SeqCst);
        if entry.directory_version < self.version() {
            return false;
        }
        self.map
            .pin()
            .insert(entry.key.clone(), Arc::new(Cached { entry, epoch }));
        true
    }

    pub fn remove(&self, key: &EntityKey) {
        self.map.pin().remove(key);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::State;

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
        let cache = Cache::new(1);
        assert!(cache.fill(entry("s1", 1)));
        assert!(
            matches!(cache.get(&EntityKey::new("tenant", "1")), Lookup::Current(e) if e.shard_name == "s1")
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
        let cache = Cache::new(1);
        cache.invalidate(3);
        assert!(!cache.fill(entry("s1", 2)));
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Absent
        ));
        assert!(cache.fill(entry("s2", 3)));
    }

    #[test]
    fn a_lower_version_is_adopted_only_from_the_version_it_was_compared_with() {
        let cache = Cache::new(1);
        cache.invalidate(9);
        assert!(cache.fill(entry("s1", 9)));
        assert!(!cache.adopt_lower(8, 4), "the known version is 9, not 8");
        assert!(cache.adopt_lower(9, 4));
        assert_eq!(cache.version(), 4);
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Stale(_)
        ));
        assert!(cache.fill(entry("s2", 4)));
    }
}
