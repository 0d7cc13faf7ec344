//! The in-process cache: entries tagged with the version they were read at and the flush epoch
//! they were filled in.
//!
//! **The invariant**: an entry read at version `r` and not marked is the directory's entry at every
//! version `v >= r` up to the known version, because every change to its key after `r` up to the
//! known version has marked it. So a hit may be stamped with the known version. It holds because
//! every write (an advance, a flush, a fill, an eviction) takes the writers' turn, and
//! [`Cache::advance`] marks every cached key the directory says changed in `(from, to]` *before*
//! it raises the known version to `to`, while a fill stores an entry only when its read is not
//! older than the known version. A lookup takes no turn: it loads the known version *before* it
//! reads the entry, so the stamp it uses never runs ahead of the marks it saw. An entry another
//! instance read at an older version (the shared cache's) holds it too: it is stored only when
//! the change log ([`crate::change_log`]), which every advance fills in the same turn as its
//! marks, says its key did not change since the read.
//!
//! Why fills take the turn too: papaya's `compute` keeps the value its closure returned for an
//! absent key, and stores it in the next empty slot when the key was inserted and removed
//! meanwhile, without calling the closure again. A check made in the closure is atomic with the
//! store only when nothing else writes the map.
//!
//! When the directory cannot say what changed (history purged, too many changes, an older
//! extension), a full flush bumps the epoch: entries of an older epoch are never served as
//! current; like marked entries they stay only for the outage policy. The hit path is a
//! lock-free map read (papaya) and three atomic loads. "The directory has no entry for this key"
//! is cached the same way. The cache holds at most `max_entries`: past it, entries no longer
//! current go first, then any.

#[cfg(sd_loom)]
use loom::sync::{
    atomic::{AtomicI64, AtomicU64},
    Mutex, MutexGuard,
};
use std::sync::atomic::Ordering::SeqCst;
#[cfg(not(sd_loom))]
use std::sync::{
    atomic::{AtomicI64, AtomicU64},
    Mutex, MutexGuard,
};

use crate::cache_key::CacheKey;
use crate::cache_map::Map;
use crate::change_log::ChangeLog;
#[cfg(any(feature = "redis", test))]
use crate::change_log::Since;
use crate::entry::{AsKeyRef, EntityKey, Entry, State};
use crate::metrics::Counters;
use crate::name::Name;

/// Held inline in the map's node, with the key: a hit follows no pointer past the node. The
/// entry's fields are kept apart (not as an `Option<Entry>`) so that key and value fit in 88
/// bytes, one 96-byte allocation per cached entity.
#[derive(Clone, Copy)]
struct Cached {
    /// `None`: the directory had no entry for the key.
    shard: Option<Name>,
    target: Option<Name>,
    region: Option<Name>,
    version: i64,
    /// The directory version the entry was read at.
    read_at: i64,
    /// The version of a change to the key after `read_at` (no longer current), or [`NEVER`].
    changed_at: i64,
    epoch: u64,
    state: State,
}

/// Key and value as papaya's node holds them: 88 bytes, which the allocator serves from its
/// 96-byte size class. A field more would make it 112.
const _: () = assert!(std::mem::size_of::<(CacheKey, Cached)>() <= 88);

/// `changed_at` of an entry not known to have changed: below every version, so that "changed
/// at or after `v`" is one comparison.
const NEVER: i64 = i64::MIN;

impl Cached {
    fn new(entry: Option<Entry>, read_at: i64, epoch: u64) -> Cached {
        Cached {
            shard: entry.map(|e| e.shard_name),
            target: entry.and_then(|e| e.target_shard),
            region: entry.and_then(|e| e.region),
            version: entry.map_or(0, |e| e.version),
            read_at,
            changed_at: NEVER,
            epoch,
            state: entry.map_or(State::Active, |e| e.state),
        }
    }

    fn entry(&self) -> Option<Entry> {
        Some(Entry {
            shard_name: self.shard?,
            target_shard: self.target,
            state: self.state,
            region: self.region,
            version: self.version,
            directory_version: self.read_at,
        })
    }
}

/// The steps whose order the invariant rests on. Tests run code there (`interleave`); the
/// concurrent test yields there to widen the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// In an advance: every change is marked, the known version is not raised yet.
    Marked,
    /// In a lookup: the known version is loaded, the entry is not read yet.
    VersionLoaded,
    /// In a flush: the epoch is bumped, the known version is not raised yet.
    EpochBumped,
    /// In a fill: the entry passed its checks, it is not stored yet.
    FillChecked,
}

/// Code a test runs when this thread reaches a step.
#[cfg(all(test, not(sd_loom)))]
type StepHook = (Step, Box<dyn FnOnce()>);

#[cfg(all(test, not(sd_loom)))]
thread_local! {
    static AT_STEP: std::cell::RefCell<Option<StepHook>> = const { std::cell::RefCell::new(None) };
}

/// In the loom model, loom chooses every interleaving itself.
#[inline]
fn interleave(step: Step) {
    #[cfg(all(test, not(sd_loom)))]
    {
        let hook = AT_STEP.with_borrow_mut(|h| h.take_if(|(at, _)| *at == step));
        match hook {
            Some((_, run)) => run(),
            // In the writers' turn, only lookups overlap a checked fill, and they find the old
            // entry or the new one: no window to widen, and yielding would hold the turn.
            None if step == Step::FillChecked => {}
            None => (0..3).for_each(|_| std::thread::yield_now()),
        }
    }
    #[cfg(any(not(test), sd_loom))]
    let _ = step;
}

pub(crate) struct Cache {
    map: Map<Cached>,
    version: AtomicI64,
    epoch: AtomicU64,
    /// The writers' turn: every write to the map, the known version and the epoch holds it
    /// (see the module's doc). It holds what the advances learned changed: what a shared entry
    /// is checked against.
    writers: Mutex<ChangeLog>,
    /// The known version, for whoever waits for one.
    announce: tokio::sync::watch::Sender<i64>,
    max_entries: usize,
    /// The directory's epoch (`directory_epoch()`) the known version belongs to: `None` until
    /// one is read, and for a directory that has none. Entries are of this history only.
    history: Mutex<Option<String>>,
    /// The directory went back to a lower version in this epoch (a restore): standbys may hold
    /// versions it no longer has, so only what the primary itself reads says how far they may
    /// be trusted, not a notification (which anyone may send, and which names no epoch).
    went_back: std::sync::atomic::AtomicBool,
}

/// What learning a version did to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Advanced {
    /// The cache knew that version already.
    NoNews,
    /// Only the entries of the keys that changed were retired.
    ByEntity,
    /// Every entry was retired.
    Flushed,
}

/// What became of an entry another instance read ([`Cache::fill_shared`]).
#[cfg(any(feature = "redis", test))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shared {
    /// Stored as current.
    Stored,
    /// Its key changed after the read, or the cache holds a newer read.
    Refused,
    /// Read before the change log reaches: [`Cache::backfill`] it, with this `generation`.
    BeyondLog { generation: u64 },
}

/// What the cache holds for a key.
pub(crate) enum Lookup {
    /// Current as of `stamp` (the known version, or the entry's read if newer): `None` when the
    /// directory has no entry for the key.
    Current {
        entry: Option<Entry>,
        stamp: i64,
    },
    /// Filled before a flush: it may still be current, but nothing says so; only for serving
    /// during an outage.
    Stale(Entry),
    /// The directory changed the key after this entry was read: known to be wrong now, so not
    /// served even during an outage.
    Changed(Entry),
    Absent,
}

impl Cache {
    #[cfg(test)]
    pub fn new(version: i64, max_entries: usize) -> Cache {
        Cache::keeping_changes(version, max_entries, 0)
    }

    /// A cache that records up to `kept` changes, to serve entries other instances read at
    /// older versions ([`Cache::fill_shared`]).
    pub fn keeping_changes(version: i64, max_entries: usize, kept: usize) -> Cache {
        Cache {
            map: Map::new(),
            version: AtomicI64::new(version),
            epoch: AtomicU64::new(0),
            writers: Mutex::new(ChangeLog::new(version, kept)),
            announce: tokio::sync::watch::Sender::new(version),
            max_entries: max_entries.max(1),
            history: Mutex::new(None),
            went_back: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the directory went back to a lower version in the epoch the cache knows.
    pub fn went_back(&self) -> bool {
        self.went_back.load(SeqCst)
    }

    /// The directory's epoch the cache's entries belong to.
    pub fn history(&self) -> Option<String> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Learns that the directory read `version` in `epoch`. The first epoch read is adopted; a
    /// different one means another history (a failover, a restore): its versions say nothing
    /// of this cache's, so every entry is retired and `version` becomes the known version,
    /// above or below it. Returns whether the epoch was new.
    pub fn adopt_epoch(&self, epoch: &str, version: i64) -> bool {
        let mut log = self.lock();
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        match history.as_deref() {
            Some(known) if known == epoch => false,
            None => {
                *history = Some(epoch.to_owned());
                false
            }
            Some(_) => {
                *history = Some(epoch.to_owned());
                // Changed before the flush: a fill that sees the new flush epoch sees it too.
                drop(history);
                self.went_back.store(false, SeqCst);
                self.retire_all(&mut log, version);
                true
            }
        }
    }

    pub fn version(&self) -> i64 {
        self.version.load(SeqCst)
    }

    /// What the cache holds for `key` (an [`EntityKey`] or a borrowed [`crate::entry::KeyRef`]).
    pub fn get<Q: AsKeyRef + ?Sized>(&self, key: &Q) -> Lookup {
        // Before the entry: a mark made before the version was raised is then visible.
        let known = self.version.load(SeqCst);
        let epoch = self.epoch.load(SeqCst);
        interleave(Step::VersionLoaded);
        let map = self.map.pin();
        let Some(c) = map.get(key.key_ref()) else {
            return Lookup::Absent;
        };
        match c.entry() {
            entry if c.epoch == epoch && c.changed_at == NEVER => Lookup::Current {
                entry,
                stamp: known.max(c.read_at),
            },
            // In the current epoch and not current: marked.
            Some(entry) if c.epoch == epoch => Lookup::Changed(entry),
            Some(entry) => Lookup::Stale(entry),
            None => Lookup::Absent,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ChangeLog> {
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Retires every entry and publishes `version` (the caller holds the turn): the epoch first,
    /// so that a lookup that sees the new version sees the new epoch.
    fn retire_all(&self, log: &mut ChangeLog, version: i64) {
        log.restart(version);
        self.epoch.fetch_add(1, SeqCst);
        interleave(Step::EpochBumped);
        self.raise(version);
    }

    /// Publishes `version` as the known one (the caller holds the turn).
    fn raise(&self, version: i64) {
        self.version.store(version, SeqCst);
        self.announce.send_replace(version);
    }

    /// The known version as it changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<i64> {
        self.announce.subscribe()
    }

    /// Learns that the directory is at `to` and that the keys in `changed` (each with the latest
    /// version that changed it) are all that changed after `from`. Marks those keys, then raises
    /// the known version; every other entry stays current. Without a list (the directory could
    /// not say what changed), or when the known version is below `from` (it went back meanwhile,
    /// so the list does not cover the gap), every entry is retired instead.
    pub fn advance(&self, from: i64, to: i64, changed: Option<&[(EntityKey, i64)]>) -> Advanced {
        let mut log = self.lock();
        let known = self.version.load(SeqCst);
        if known >= to {
            return Advanced::NoNews;
        }
        let Some(changed) = changed.filter(|_| known >= from) else {
            self.retire_all(&mut log, to);
            return Advanced::Flushed;
        };
        let epoch = self.epoch.load(SeqCst);
        let map = self.map.pin();
        for (key, at) in changed.iter().filter(|(_, at)| *at > known) {
            let at = *at;
            log.record(key, at);
            map.update(CacheKey::from(key), |old| match old {
                Some(c) if c.epoch == epoch && (c.read_at >= at || c.changed_at >= at) => None,
                // Marked in the current epoch even if filled before a flush: known to be wrong
                // now, it is not served even during an outage.
                Some(c) => Some(Cached {
                    epoch,
                    changed_at: c.changed_at.max(at),
                    ..*c
                }),
                // A fill read before the change finds the known version past its read.
                None => None,
            });
        }
        interleave(Step::Marked);
        self.raise(to);
        Advanced::ByEntity
    }

    /// The directory stands at `version`, below the `known` version this cache learned from it
    /// earlier: it was restored from a backup, or failed over to a standby that lost commits.
    /// Adopts `version` and retires every entry. Returns false when the known version moved
    /// meanwhile (the caller reads again).
    pub fn adopt_lower(&self, known: i64, version: i64) -> bool {
        let mut log = self.lock();
        if self.version.load(SeqCst) != known {
            return false;
        }
        self.went_back.store(true, SeqCst);
        self.retire_all(&mut log, version);
        true
    }

    /// [`Cache::fill_in`] the epoch the cache knows (what a shard said, not the directory).
    pub fn fill(&self, key: &EntityKey, entry: Option<Entry>, read_at: i64) -> bool {
        let history = self.history();
        self.fill_in(key, entry, read_at, history.as_deref())
    }

    /// Stores what a fetch of `key` read at directory version `read_at` in the directory's
    /// epoch `read_in` (`None`: no entry), if nothing newer is known and the read was of this
    /// cache's history. Returns whether it was stored as current.
    pub fn fill_in(
        &self,
        key: &EntityKey,
        entry: Option<Entry>,
        read_at: i64,
        read_in: Option<&str>,
    ) -> bool {
        let turn = self.lock();
        let known = self.version.load(SeqCst);
        self.store(&turn, key, entry, read_at, read_in, known)
    }

    /// Stores `entry`, which another instance read at `entry.directory_version` in the
    /// directory's epoch `read_in` (the shared cache's). A read at the known version is an
    /// ordinary fill; one past it is refused until the directory says that version (another
    /// instance may have read a history the directory has since gone back from, as after a
    /// restore, in the same epoch until the restored directory's first change). An older read is
    /// current when the change log says its key did not change since: the entry is then the
    /// directory's entry at the known version, as a read now would be. Checked and stored in the
    /// writers' turn, so no advance runs in between.
    #[cfg(any(feature = "redis", test))]
    pub fn fill_shared(&self, key: &EntityKey, entry: Entry, read_in: Option<&str>) -> Shared {
        let read_at = entry.directory_version;
        let turn = self.lock();
        let known = self.version.load(SeqCst);
        let floor = if read_at > known {
            return Shared::Refused;
        } else if read_at == known {
            known
        } else {
            match turn.since(&CacheKey::from(key), read_at) {
                Since::BeyondLog { generation } => return Shared::BeyondLog { generation },
                Since::Changed => return Shared::Refused,
                Since::Unchanged => i64::MIN,
            }
        };
        match self.store(&turn, key, Some(entry), read_at, read_in, floor) {
            true => Shared::Stored,
            false => Shared::Refused,
        }
    }

    /// Adds what the directory said changed in `(since, through]` in its epoch `read_in`, read
    /// while the change log was of `generation`, so that it reaches back to `since`. Returns
    /// whether it does now.
    #[cfg(any(feature = "redis", test))]
    pub fn backfill(
        &self,
        generation: u64,
        read_in: Option<&str>,
        since: i64,
        through: i64,
        changed: &[(EntityKey, i64)],
    ) -> bool {
        let mut log = self.lock();
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        history.as_deref() == read_in && log.backfill(generation, since, through, changed)
    }

    /// Stores the entry `key` had at `read_at` in the directory's epoch `read_in` (`None`: no
    /// entry), unless the read is of another history, the cache holds a newer read or a change
    /// after it, or the read is below `floor`; in the writers' `turn`, which it then uses to
    /// bring the cache back under its bound.
    fn store(
        &self,
        turn: &MutexGuard<'_, ChangeLog>,
        key: &EntityKey,
        entry: Option<Entry>,
        read_at: i64,
        read_in: Option<&str>,
        floor: i64,
    ) -> bool {
        debug_assert!(entry.is_none_or(|e| e.directory_version == read_at));
        let epoch = self.epoch.load(SeqCst);
        // After the flush epoch: a change of history is made before its flush.
        if self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            != read_in
        {
            return false;
        }
        let map = self.map.pin();
        let fresh = Cached::new(entry, read_at, epoch);
        let stored = map.update(CacheKey::from(key), |old| {
            let newer_or_changed = old.is_some_and(|c| {
                c.epoch == epoch
                    && (c.changed_at > read_at || (c.changed_at == NEVER && c.read_at > read_at))
            });
            let store = !newer_or_changed && read_at >= floor;
            if store {
                interleave(Step::FillChecked);
            }
            store.then_some(fresh)
        });
        if stored && self.map.len() > self.max_entries {
            self.shrink(turn);
        }
        stored
    }

    /// Brings the cache back under its bound (in the writers' turn): entries no longer current
    /// first, then any, down to nine tenths of the bound so that a full cache does not shrink on
    /// every fill.
    fn shrink(&self, _turn: &MutexGuard<'_, ChangeLog>) {
        let epoch = self.epoch.load(SeqCst);
        let map = self.map.pin();
        map.retain(|c| c.epoch == epoch && c.changed_at == NEVER);
        let target = self.max_entries - self.max_entries / 10;
        let excess = map.len().saturating_sub(target);
        for key in &map.some_keys(excess) {
            map.remove(key);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// The directory's version went back from `known` to `version`: adopts it, flushes the cache, and
/// says so. Returns false when the known version moved meanwhile.
pub(crate) fn adopt_lower(cache: &Cache, counters: &Counters, known: i64, version: i64) -> bool {
    if !cache.adopt_lower(known, version) {
        return false;
    }
    counters.version_regressed(version);
    tracing::warn!(
        known,
        directory = version,
        "shard directory version went back (restored from a backup, or failed over to a standby \
         that lost commits): adopting it and flushing the cache"
    );
    true
}

/// The directory read `version` in `epoch`: when that is a new epoch (a failover, a restore),
/// the cache was flushed and goes on from `version`; counted and said. Returns whether it was.
pub(crate) fn adopt_epoch(cache: &Cache, counters: &Counters, epoch: &str, version: i64) -> bool {
    if !cache.adopt_epoch(epoch, version) {
        return false;
    }
    counters.epoch_changed(version);
    tracing::warn!(
        epoch,
        version,
        "the shard directory's epoch changed (it failed over, or was restored): its versions \
         are another history's; flushed the cache"
    );
    true
}

#[cfg(test)]
mod fixtures {
    use crate::entry::{EntityKey, Entry, State};
    use crate::name::Name;

    pub fn key(i: usize) -> EntityKey {
        EntityKey::new("tenant", i.to_string())
    }

    /// The entry of a tenant on `shard`, read at directory version `at`.
    pub fn at(shard: &str, at: i64) -> Entry {
        Entry {
            shard_name: Name::new(shard),
            target_shard: None,
            state: State::Active,
            region: None,
            version: at,
            directory_version: at,
        }
    }
}

#[cfg(all(test, not(sd_loom)))]
mod tests {
    use super::fixtures::{at, key};
    use super::*;
    use crate::entry::KeyRef;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A version learned without a list of what changed.
    fn flush(cache: &Cache, version: i64) -> bool {
        cache.advance(version, version, None) == Advanced::Flushed
    }

    /// Fills tenant 1.
    fn fill(cache: &Cache, entry: Entry) -> bool {
        let at = entry.directory_version;
        cache.fill(&key(1), Some(entry), at)
    }

    #[test]
    fn an_invalidation_retires_every_entry_filled_before_it() {
        let cache = Cache::new(1, 100);
        assert!(fill(&cache, at("s1", 1)));
        assert!(
            matches!(cache.get(&EntityKey::new("tenant", "1")), Lookup::Current { entry: Some(e), .. } if e.shard_name == "s1")
        );
        assert!(flush(&cache, 2));
        assert!(!flush(&cache, 2), "the same version twice is no news");
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Stale(_)
        ));
    }

    #[test]
    fn a_fill_read_before_the_known_version_is_refused() {
        let cache = Cache::new(1, 100);
        flush(&cache, 3);
        assert!(!fill(&cache, at("s1", 2)));
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Absent
        ));
        assert!(fill(&cache, at("s2", 3)));
    }

    #[test]
    fn a_lower_version_is_adopted_only_from_the_version_it_was_compared_with() {
        let cache = Cache::new(1, 100);
        flush(&cache, 9);
        assert!(fill(&cache, at("s1", 9)));
        assert!(!cache.adopt_lower(8, 4), "the known version is 9, not 8");
        assert!(cache.adopt_lower(9, 4));
        assert_eq!(cache.version(), 4);
        assert!(matches!(
            cache.get(&EntityKey::new("tenant", "1")),
            Lookup::Stale(_)
        ));
        assert!(fill(&cache, at("s2", 4)));
    }

    #[test]
    fn another_epoch_retires_every_entry_and_a_read_of_the_old_one_is_refused() {
        let cache = Cache::new(9, 100);
        assert!(
            !cache.adopt_epoch("7.1", 9),
            "the first epoch read is adopted"
        );
        assert!(cache.fill_in(&key(1), Some(at("s1", 9)), 9, Some("7.1")));
        assert!(!cache.adopt_epoch("7.1", 9));
        // Promoted standby: timeline 2, at a version the old history also had.
        assert!(cache.adopt_epoch("7.2", 9));
        assert_eq!(cache.version(), 9);
        assert!(matches!(cache.get(&key(1)), Lookup::Stale(_)));
        assert!(
            !cache.fill_in(&key(1), Some(at("s1", 9)), 9, Some("7.1")),
            "read before the failover"
        );
        assert!(!cache.fill_in(&key(1), Some(at("s1", 9)), 9, None));
        assert!(cache.fill_in(&key(1), Some(at("s2", 9)), 9, Some("7.2")));
        assert!(
            matches!(cache.get(&key(1)), Lookup::Current { entry: Some(e), .. } if e.shard_name == "s2")
        );
    }

    #[test]
    fn unknown_entities_are_cached_and_retired_like_entries() {
        let cache = Cache::new(1, 100);
        let key = EntityKey::new("tenant", "nope");
        assert!(cache.fill(&key, None, 1));
        assert!(matches!(
            cache.get(&key),
            Lookup::Current { entry: None, .. }
        ));
        flush(&cache, 2);
        assert!(matches!(cache.get(&key), Lookup::Absent));
    }

    #[test]
    fn the_cache_stays_within_its_bound_older_epochs_first() {
        let cache = Cache::new(1, 10);
        let key = |i: usize| EntityKey::new("tenant", i.to_string());
        for i in 0..5 {
            assert!(cache.fill(&key(i), None, 1));
        }
        flush(&cache, 2);
        for i in 5..11 {
            assert!(cache.fill(&key(i), None, 2));
        }
        // Over the bound: the five entries of the older epoch went, the six current ones stayed.
        assert_eq!(cache.len(), 6);
        assert!((5..11).all(|i| matches!(cache.get(&key(i)), Lookup::Current { entry: None, .. })));
        for i in 11..100 {
            cache.fill(&key(i), None, 2);
            assert!(cache.len() <= 10);
        }
    }

    #[test]
    fn an_advance_retires_only_the_keys_that_changed_and_stamps_the_rest_with_the_new_version() {
        let cache = Cache::new(1, 100);
        for i in 0..3 {
            assert!(cache.fill(&key(i), Some(at("s1", 1)), 1));
        }
        let unknown = key(9);
        assert!(cache.fill(&unknown, None, 1));
        // Version 2 changed tenant 1; version 3 inserted tenant 9.
        assert_eq!(
            cache.advance(1, 3, Some(&[(key(1), 2), (unknown.clone(), 3)])),
            Advanced::ByEntity
        );
        assert_eq!(cache.version(), 3);
        assert!(
            matches!(cache.get(&key(0)), Lookup::Current { entry: Some(e), stamp: 3 } if e.directory_version == 1)
        );
        assert!(matches!(cache.get(&key(1)), Lookup::Changed(_)));
        assert!(matches!(cache.get(&unknown), Lookup::Absent));
        assert_eq!(
            cache.advance(1, 3, Some(&[])),
            Advanced::NoNews,
            "the same version twice is no news"
        );
        // A read at 3 replaces the retired entry.
        assert!(cache.fill(&key(1), Some(at("s2", 3)), 3));
        assert!(matches!(
            cache.get(&key(1)),
            Lookup::Current { stamp: 3, .. }
        ));
    }

    #[test]
    fn a_fill_read_before_a_change_the_cache_has_heard_of_is_refused() {
        let cache = Cache::new(5, 100);
        assert!(cache.fill(&key(1), Some(at("s1", 5)), 5));
        assert_eq!(
            cache.advance(5, 7, Some(&[(key(1), 6)])),
            Advanced::ByEntity
        );
        assert!(
            !cache.fill(&key(1), Some(at("s1", 5)), 5),
            "read before the known version"
        );
        assert!(cache.fill(&key(1), Some(at("s2", 7)), 7));
        assert!(
            !cache.fill(&key(1), Some(at("s1", 6)), 6),
            "an older read does not replace a newer one"
        );
    }

    #[test]
    fn an_advance_from_a_version_the_cache_went_below_flushes() {
        let cache = Cache::new(9, 100);
        assert!(cache.fill(&key(0), Some(at("s1", 9)), 9));
        assert!(cache.adopt_lower(9, 4));
        assert!(cache.fill(&key(1), Some(at("s1", 4)), 4));
        // The list covers (9, 10], not (4, 9]: everything goes.
        assert_eq!(cache.advance(9, 10, Some(&[])), Advanced::Flushed);
        assert!(matches!(cache.get(&key(1)), Lookup::Stale(_)));
    }

    #[test]
    fn a_shared_entry_read_before_changes_to_other_keys_is_current_at_the_known_version() {
        let cache = Cache::keeping_changes(5, 100, 10);
        assert_eq!(
            cache.advance(5, 8, Some(&[(key(2), 6), (key(3), 8)])),
            Advanced::ByEntity
        );
        // Read by another instance at 5 and 7: key 1 did not change since, key 2 did at 6.
        assert_eq!(
            cache.fill_shared(&key(1), at("s1", 5), None),
            Shared::Stored
        );
        assert!(matches!(
            cache.get(&key(1)),
            Lookup::Current { stamp: 8, entry: Some(e) } if e.shard_name == "s1"
        ));
        assert_eq!(
            cache.fill_shared(&key(2), at("s1", 5), None),
            Shared::Refused
        );
        assert_eq!(
            cache.fill_shared(&key(3), at("s1", 7), None),
            Shared::Refused
        );
        assert!(matches!(cache.get(&key(2)), Lookup::Absent));
        // Read after the change: current.
        assert_eq!(
            cache.fill_shared(&key(2), at("s2", 6), None),
            Shared::Stored
        );
        // Read before the log reaches (it starts at 5), or in another epoch: not taken.
        assert_eq!(
            cache.fill_shared(&key(4), at("s1", 4), None),
            Shared::BeyondLog { generation: 0 }
        );
        assert_eq!(
            cache.fill_shared(&key(4), at("s1", 9), Some("other")),
            Shared::Refused
        );
        // The directory lists what changed in (3, 8]: key 4 did not.
        assert!(!cache.backfill(0, Some("other"), 3, 8, &[(key(2), 6)]));
        assert!(cache.backfill(0, None, 3, 8, &[(key(2), 6), (key(5), 4)]));
        assert_eq!(
            cache.fill_shared(&key(4), at("s1", 4), None),
            Shared::Stored
        );
        assert_eq!(
            cache.fill_shared(&key(5), at("s1", 3), None),
            Shared::Refused
        );
        // A flush forgets what changed: a backfill read before it is refused.
        assert_eq!(cache.advance(8, 9, None), Advanced::Flushed);
        assert_eq!(
            cache.fill_shared(&key(6), at("s1", 8), None),
            Shared::BeyondLog { generation: 1 }
        );
        assert!(!cache.backfill(0, None, 3, 9, &[]));
        assert!(cache.backfill(1, None, 3, 9, &[]));
        assert_eq!(
            cache.fill_shared(&key(6), at("s1", 8), None),
            Shared::Stored
        );
    }

    /// Runs `run` when this thread's cache code reaches `step`.
    fn at_step(step: Step, run: impl FnOnce() + 'static) {
        AT_STEP.with_borrow_mut(|h| *h = Some((step, Box::new(run))));
    }

    /// When this thread's cache code reaches `step`, runs `run` on another thread and gives it
    /// until a deadline to finish there: a step that waits for the writers' turn cannot finish
    /// while this thread holds it. Join what it returns once the step is done.
    fn aside_at<T: Send + 'static>(
        step: Step,
        run: impl FnOnce() -> T + Send + 'static,
    ) -> Aside<T> {
        let aside = Aside(Arc::new(std::sync::Mutex::new(None)));
        let started = aside.0.clone();
        at_step(step, move || {
            let handle = std::thread::spawn(run);
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
            while !handle.is_finished() && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            *started.lock().unwrap() = Some(handle);
        });
        aside
    }

    struct Aside<T>(Arc<std::sync::Mutex<Option<std::thread::JoinHandle<T>>>>);

    impl<T> Aside<T> {
        fn join(self) -> T {
            let handle = self.0.lock().unwrap().take();
            handle.expect("the step was reached").join().unwrap()
        }
    }

    /// Found by the stress test below (1 run in 20 under load): papaya's `compute` keeps the
    /// value its closure returned for an absent key, and stores it in the next empty slot when
    /// the key was inserted and removed meanwhile, without calling the closure again. A fill
    /// checked before an advance (its tombstone inserted and removed) was stored after it, as
    /// current, read before the change.
    #[test]
    fn a_fill_checked_before_an_advance_is_not_current_after_it() {
        let cache = Arc::new(Cache::new(5, 100));
        let watcher = cache.clone();
        let advance = aside_at(Step::FillChecked, move || {
            watcher.advance(5, 6, Some(&[(key(1), 6)]))
        });
        cache.fill(&key(1), Some(at("s1", 5)), 5);
        assert_eq!(advance.join(), Advanced::ByEntity);
        assert_eq!(cache.version(), 6);
        match cache.get(&key(1)) {
            Lookup::Current { entry, stamp } => {
                let shard = entry.map(|e| e.shard_name.to_string());
                panic!("read at 5 before the change at 6, current at {stamp}: {shard:?}")
            }
            Lookup::Changed(_) | Lookup::Absent => {}
            Lookup::Stale(_) => panic!("no flush ran"),
        }
    }

    #[test]
    fn a_fill_that_read_before_a_change_and_arrives_in_the_middle_of_its_advance_is_refused() {
        let cache = Arc::new(Cache::new(5, 100));
        let filler = cache.clone();
        // Read at 5, stored while the advance to 6 (which changed the key) is half done:
        // nothing was cached for the key, so no mark can refuse the fill.
        let fill = aside_at(Step::Marked, move || {
            filler.fill(&key(1), Some(at("s1", 5)), 5)
        });
        assert_eq!(
            cache.advance(5, 6, Some(&[(key(1), 6)])),
            Advanced::ByEntity
        );
        assert!(!fill.join(), "the fill was stored");
        assert!(matches!(cache.get(&key(1)), Lookup::Absent));
        assert!(cache.fill(&key(1), Some(at("s2", 6)), 6));
    }

    /// Found by the loom model (`loom_model` below): a fill that read before a flush, stored
    /// after the flush bumped the epoch and before it raised the version, was current in the
    /// new epoch, and then stamped with the flush's version.
    #[test]
    fn a_fill_read_before_a_flush_and_stored_in_the_middle_of_it_is_not_current() {
        let cache = Arc::new(Cache::new(5, 100));
        let filler = cache.clone();
        let fill = aside_at(Step::EpochBumped, move || {
            filler.fill(&key(1), Some(at("s1", 5)), 5)
        });
        assert_eq!(cache.advance(5, 6, None), Advanced::Flushed);
        assert!(!fill.join(), "the fill was stored");
        assert!(
            !matches!(cache.get(&key(1)), Lookup::Current { .. }),
            "read at 5, current at 6"
        );
    }

    #[test]
    fn a_lookup_that_overlaps_an_advance_never_stamps_a_changed_entry_with_the_new_version() {
        let cache = Arc::new(Cache::new(5, 100));
        assert!(cache.fill(&key(1), Some(at("s1", 5)), 5));
        let watcher = cache.clone();
        // The advance to 6, which changed the key, runs whole between the lookup's two reads.
        at_step(Step::VersionLoaded, move || {
            assert_eq!(
                watcher.advance(5, 6, Some(&[(key(1), 6)])),
                Advanced::ByEntity
            );
        });
        match cache.get(&key(1)) {
            Lookup::Current { stamp, .. } => assert!(stamp < 6, "stamped {stamp}"),
            Lookup::Changed(_) => {}
            other => panic!("the entry went: {}", matches!(other, Lookup::Absent)),
        }
        assert!(matches!(cache.get(&key(1)), Lookup::Changed(_)));
    }

    /// The invariant under a race: writers change a simulated directory (each change bumps the
    /// version and appends to history, in order), a watcher advances the cache from history,
    /// fillers read entries and store them after a delay, and readers check every current hit
    /// against the directory's history: the entry must be the directory's entry at the version
    /// the hit is stamped with. Full flushes are mixed in. The fillers also share what they read
    /// (the newest read per key, as the shared cache keeps it), and a sharer stores those reads
    /// through the change log, which is smaller than the keys, and backfills it from history;
    /// it evicts the key from the map first, often, so that the log alone decides.
    #[test]
    fn every_current_hit_is_the_directorys_entry_at_its_stamp_under_concurrent_changes() {
        use std::collections::HashMap;
        use std::sync::Mutex;

        const KEYS: usize = 16;
        #[derive(Default)]
        struct Directory {
            version: i64,
            /// Per key: (version, shard or None when deleted), in version order.
            values: HashMap<usize, Vec<(i64, Option<String>)>>,
            history: Vec<(i64, usize)>,
        }
        impl Directory {
            fn at(&self, k: usize, version: i64) -> Option<String> {
                let values = self.values.get(&k)?;
                values.iter().rev().find(|(v, _)| *v <= version)?.1.clone()
            }

            /// The keys changed after `since`, each with its latest change, as `changes_since`.
            fn changed_since(&self, since: i64) -> Vec<(EntityKey, i64)> {
                let mut changed: HashMap<usize, i64> = HashMap::new();
                for (v, k) in self.history.iter().filter(|(v, _)| *v > since) {
                    changed.insert(*k, *v);
                }
                changed.into_iter().map(|(k, v)| (key(k), v)).collect()
            }
        }
        let directory = Mutex::new(Directory::default());
        let shared: Mutex<HashMap<usize, Entry>> = Mutex::default();
        let cache = Cache::keeping_changes(0, 1_000, KEYS / 2);
        // Shared entries stored although read before the known version.
        let shared_older = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let checked = AtomicU64::new(0);
        let xorshift = |seed: &mut u64| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut seed = 0x9e3779b97f4a7c15u64;
                // At least 2 s of changes, and on until the readers have checked enough hits and
                // the sharer stored enough older reads (a loaded machine schedules them rarely),
                // within a deadline.
                let now = std::time::Instant::now;
                let until = now() + std::time::Duration::from_secs(2);
                let deadline = now() + std::time::Duration::from_secs(60);
                let short = || checked.load(SeqCst) <= 1_000 || shared_older.load(SeqCst) <= 100;
                while now() < until || (short() && now() < deadline) {
                    let mut d = directory.lock().unwrap();
                    d.version += 1;
                    let (v, k) = (d.version, xorshift(&mut seed) as usize % KEYS);
                    let shard = (xorshift(&mut seed) % 4 != 0).then(|| format!("s{v}"));
                    d.values.entry(k).or_default().push((v, shard));
                    d.history.push((v, k));
                    drop(d);
                    std::thread::yield_now();
                }
                stop.store(true, SeqCst);
            });
            s.spawn(|| {
                let mut rounds = 0u64;
                while !stop.load(SeqCst) {
                    rounds += 1;
                    let since = cache.version();
                    let d = directory.lock().unwrap();
                    let (to, changed) = (d.version, d.changed_since(since));
                    drop(d);
                    let listed = (!rounds.is_multiple_of(50)).then_some(&changed[..]);
                    cache.advance(since, to, listed);
                    // Outside the turn: else this loop, which takes it again at once, keeps it
                    // from the fillers on a loaded machine.
                    std::thread::yield_now();
                }
            });
            for n in 0..2u64 {
                let (directory, cache, stop, shared) = (&directory, &cache, &stop, &shared);
                s.spawn(move || {
                    let mut seed = 0x2545f4914f6cdd1du64 + n;
                    while !stop.load(SeqCst) {
                        let k = xorshift(&mut seed) as usize % KEYS;
                        let d = directory.lock().unwrap();
                        let (read_at, shard) = (d.version, d.at(k, d.version));
                        drop(d);
                        for _ in 0..xorshift(&mut seed) % 16 {
                            std::thread::yield_now();
                        }
                        let entry = shard.map(|shard| at(&shard, read_at));
                        if cache.fill(&key(k), entry, read_at) {
                            if let Some(entry) = entry {
                                let mut shared = shared.lock().unwrap();
                                let held = shared.entry(k).or_insert(entry);
                                if held.directory_version < read_at {
                                    *held = entry;
                                }
                            }
                        }
                    }
                });
            }
            s.spawn(|| {
                let mut seed = 0x6a09e667f3bcc909u64;
                while !stop.load(SeqCst) {
                    let k = xorshift(&mut seed) as usize % KEYS;
                    let Some(entry) = shared.lock().unwrap().get(&k).copied() else {
                        continue;
                    };
                    // Evicted first (as `shrink` does), often: else what the map holds decides.
                    if xorshift(&mut seed) % 2 == 0 {
                        let _turn = cache.lock();
                        cache.map.pin().remove(&CacheKey::from(&key(k)));
                    }
                    let since = entry.directory_version;
                    let mut done = cache.fill_shared(&key(k), entry, None);
                    if let Shared::BeyondLog { generation } = done {
                        let d = directory.lock().unwrap();
                        let (through, changed) = (d.version, d.changed_since(since));
                        drop(d);
                        std::thread::yield_now();
                        if cache.backfill(generation, None, since, through, &changed) {
                            done = cache.fill_shared(&key(k), entry, None);
                        }
                    }
                    if done == Shared::Stored && since < cache.version() {
                        shared_older.fetch_add(1, SeqCst);
                    }
                }
            });
            for n in 0..2u64 {
                let (directory, cache, stop, checked) = (&directory, &cache, &stop, &checked);
                s.spawn(move || {
                    let mut seed = 0x853c49e6748fea9bu64 + n;
                    while !stop.load(SeqCst) {
                        let k = xorshift(&mut seed) as usize % KEYS;
                        if let Lookup::Current { entry, stamp } = cache.get(&key(k)) {
                            let expected = directory.lock().unwrap().at(k, stamp);
                            let got = entry.map(|e| e.shard_name.to_string());
                            assert_eq!(got, expected, "tenant {k} at stamp {stamp}");
                            checked.fetch_add(1, SeqCst);
                        }
                    }
                });
            }
        });
        let checked = checked.load(SeqCst);
        assert!(checked > 1_000, "only {checked} current hits were checked");
        let shared_older = shared_older.load(SeqCst);
        assert!(
            shared_older > 100,
            "only {shared_older} older shared reads were stored"
        );
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
        assert!(fill(&cache, at("shard_1", 1)));
        let borrowed = KeyRef {
            entity_type: "tenant",
            entity_id: "1",
        };
        let before = ALLOCATIONS.with(|n| n.get());
        let found = matches!(cache.get(&borrowed), Lookup::Current { entry: Some(e), .. } if e.shard_name == "shard_1");
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

/// The invariant, checked by loom over the interleavings of a watcher's advance, a fill (or a
/// shared entry's fill) racing it, and a lookup (`RUSTFLAGS="--cfg sd_loom" cargo test -p shard-directory-client --lib
/// loom`, run by `scripts/test.sh`). The directory of the model: tenant 1 on `s1` up to version
/// 5, moved to `s2` at version 6. A current hit must be the directory's entry at its stamp,
/// during the race and after it. It found the flush race that
/// `a_fill_read_before_a_flush_and_stored_in_the_middle_of_it_is_not_current` now pins down.
/// Its limit: loom 0.7 models `SeqCst` as acquire/release, without the single total order the
/// cache relies on between the known version and the map. A reordering planted to test it (the
/// version raised before the marks) went unnoticed here; the stress test above catches it. Nor
/// could it find `a_fill_checked_before_an_advance_is_not_current_after_it`: its map makes each
/// operation one step, which papaya's `compute` is not when writers race; since writers take
/// turns, it is.
#[cfg(all(test, sd_loom))]
mod loom_model {
    use super::fixtures::{at, key};
    use super::*;
    use loom::sync::Arc;

    /// Where the directory of the model has tenant 1 at `version`.
    fn truth(version: i64) -> &'static str {
        if version >= 6 {
            "s2"
        } else {
            "s1"
        }
    }

    fn check(cache: &Cache) {
        if let Lookup::Current { entry, stamp } = cache.get(&key(1)) {
            let shard = entry.map(|e| e.shard_name.to_string());
            assert_eq!(
                shard.as_deref(),
                Some(truth(stamp)),
                "a hit stamped {stamp}"
            );
        }
    }

    /// The cache at version 5 (tenant 1 cached when `cached`) learns version 6: with the list of
    /// what changed (tenant 1) when `listed`, else as a flush. Meanwhile a fill stores what it
    /// read at `read_at`, and a lookup checks.
    fn explore(cached: bool, listed: bool, read_at: i64) {
        loom::model(move || {
            let cache = Arc::new(Cache::new(5, 100));
            if cached {
                assert!(cache.fill(&key(1), Some(at("s1", 5)), 5));
            }
            let watcher = {
                let cache = cache.clone();
                loom::thread::spawn(move || {
                    let changed = [(key(1), 6)];
                    cache.advance(5, 6, listed.then_some(&changed[..]));
                })
            };
            let filler = {
                let cache = cache.clone();
                loom::thread::spawn(move || {
                    cache.fill(&key(1), Some(at(truth(read_at), read_at)), read_at);
                })
            };
            check(&cache);
            watcher.join().unwrap();
            filler.join().unwrap();
            check(&cache);
        });
    }

    #[test]
    fn loom_a_fill_read_before_the_change_is_never_current_after_it() {
        explore(false, true, 5);
    }

    #[test]
    fn loom_a_cached_entry_is_never_stamped_with_the_version_that_changed_it() {
        explore(true, true, 5);
    }

    #[test]
    fn loom_a_fill_read_at_the_change_races_its_mark() {
        explore(true, true, 6);
        explore(false, true, 6);
    }

    /// Another instance's read of tenant 1 at `read_at` (4: before the log reaches, until it is
    /// backfilled) is stored from the shared cache while the advance to 6 runs.
    fn explore_shared(read_at: i64, listed: bool) {
        loom::model(move || {
            let cache = Arc::new(Cache::keeping_changes(5, 100, 10));
            assert!(cache.backfill(0, None, 4, 5, &[]));
            let watcher = {
                let cache = cache.clone();
                loom::thread::spawn(move || {
                    let changed = [(key(1), 6)];
                    cache.advance(5, 6, listed.then_some(&changed[..]));
                })
            };
            let sharer = {
                let cache = cache.clone();
                loom::thread::spawn(move || {
                    cache.fill_shared(&key(1), at(truth(read_at), read_at), None);
                })
            };
            check(&cache);
            watcher.join().unwrap();
            sharer.join().unwrap();
            check(&cache);
        });
    }

    #[test]
    fn loom_a_shared_entry_read_before_the_change_is_never_current_after_it() {
        explore_shared(4, true);
        explore_shared(4, false);
        explore_shared(6, true);
    }

    #[test]
    fn loom_a_flush_retires_a_fill_read_before_it() {
        explore(true, false, 5);
        explore(false, false, 5);
    }
}
