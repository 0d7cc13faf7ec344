//! What changed, key by key, after a version: the in-process cache records every change it is
//! told of, so that an entry another instance read at an older version (the shared cache's) can
//! be served as current here when its key is not among the changes after its read. Bounded: past
//! its capacity the oldest records go, and with them the log's claim to reach that far back.

use std::collections::{HashMap, VecDeque};

use crate::cache_key::CacheKey;
use crate::entry::EntityKey;

pub(crate) struct ChangeLog {
    /// Each recorded key's latest change.
    latest: HashMap<CacheKey, i64, foldhash::fast::RandomState>,
    /// The records in about the order of their versions, oldest first; a record whose key has
    /// changed again since is skipped when it is reached.
    order: VecDeque<(i64, CacheKey)>,
    /// Every change after this version is recorded.
    complete_after: i64,
    /// Bumped when the log starts over: a backfill read before then is of a history the log
    /// no longer holds (the directory went back to a lower version, or to another epoch).
    generation: u64,
    capacity: usize,
}

/// Whether a key changed after a read, as far as the log can say.
#[cfg(any(feature = "redis", test))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Since {
    Unchanged,
    Changed,
    /// The read is older than the log reaches: the log of this `generation` would need the
    /// changes after the read.
    BeyondLog {
        generation: u64,
    },
}

impl ChangeLog {
    /// A log that starts complete after `version` and keeps at most `capacity` records (0: the
    /// log keeps nothing and reaches back to the latest change only).
    pub fn new(version: i64, capacity: usize) -> ChangeLog {
        ChangeLog {
            latest: HashMap::default(),
            order: VecDeque::new(),
            complete_after: version,
            generation: 0,
            capacity,
        }
    }

    /// Whether `key` changed after `read_at`.
    #[cfg(any(feature = "redis", test))]
    pub fn since(&self, key: &CacheKey, read_at: i64) -> Since {
        if read_at < self.complete_after {
            return Since::BeyondLog {
                generation: self.generation,
            };
        }
        match self.latest.get(key) {
            Some(&at) if at > read_at => Since::Changed,
            _ => Since::Unchanged,
        }
    }

    /// Records that `key` changed at `at`. Every change after the log's reach must be recorded
    /// for it to stay complete.
    pub fn record(&mut self, key: &EntityKey, at: i64) {
        if self.capacity == 0 {
            self.complete_after = self.complete_after.max(at);
            return;
        }
        let key = CacheKey::from(key);
        if self.latest.get(&key).is_some_and(|&v| v >= at) {
            return;
        }
        self.latest.insert(key.clone(), at);
        self.order.push_back((at, key));
        self.trim();
    }

    /// Forgets every record: the log is complete after `version` only. A backfill of an
    /// earlier generation is refused.
    pub fn restart(&mut self, version: i64) {
        self.latest.clear();
        self.order.clear();
        self.complete_after = version;
        self.generation += 1;
    }

    /// Adds the changes the directory listed in `(since, through]` (all of them), read while
    /// the log was of `generation`. The log then reaches back to `since` when the list meets
    /// it (`through` at or after its reach). Returns whether it did.
    #[cfg(any(feature = "redis", test))]
    pub fn backfill(
        &mut self,
        generation: u64,
        since: i64,
        through: i64,
        changed: &[(EntityKey, i64)],
    ) -> bool {
        if generation != self.generation
            || through < self.complete_after
            || since >= self.complete_after
            || self.capacity == 0
        {
            return false;
        }
        let mut older: Vec<(i64, CacheKey)> = Vec::new();
        for (key, at) in changed {
            let key = CacheKey::from(key);
            if self.latest.get(&key).is_some_and(|&v| v >= *at) {
                continue;
            }
            self.latest.insert(key.clone(), *at);
            older.push((*at, key));
        }
        // Oldest at the front, so that they go first.
        older.sort_unstable_by_key(|(at, _)| std::cmp::Reverse(*at));
        for record in older {
            self.order.push_front(record);
        }
        self.complete_after = since;
        self.trim();
        true
    }

    /// Drops the oldest records past the capacity; the log then reaches back only to the
    /// newest version dropped.
    fn trim(&mut self) {
        while self.order.len() > self.capacity {
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            if self.latest.get(&key) == Some(&at) {
                self.latest.remove(&key);
            }
            self.complete_after = self.complete_after.max(at);
        }
    }

    #[cfg(test)]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    #[cfg(test)]
    pub fn complete_after(&self) -> i64 {
        self.complete_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> EntityKey {
        EntityKey::new("tenant", n.to_string())
    }

    fn since(log: &ChangeLog, n: u32, read_at: i64) -> Since {
        log.since(&CacheKey::from(&key(n)), read_at)
    }

    #[test]
    fn a_key_is_unchanged_after_a_read_unless_a_change_after_it_was_recorded() {
        let mut log = ChangeLog::new(10, 100);
        log.record(&key(1), 12);
        assert_eq!(since(&log, 1, 11), Since::Changed);
        assert_eq!(since(&log, 1, 12), Since::Unchanged, "read with the change");
        assert_eq!(since(&log, 2, 10), Since::Unchanged);
        assert_eq!(since(&log, 2, 9), Since::BeyondLog { generation: 0 });
        log.record(&key(1), 11);
        assert_eq!(
            since(&log, 1, 11),
            Since::Changed,
            "an older record is ignored"
        );
    }

    #[test]
    fn past_its_capacity_the_log_reaches_back_only_to_the_newest_record_dropped() {
        let mut log = ChangeLog::new(0, 2);
        for (n, at) in [(1, 1), (2, 2), (1, 3), (3, 4)] {
            log.record(&key(n), at);
        }
        // (1, 1) was superseded by (1, 3); dropping it and then (2, 2) leaves the log whole
        // after 2.
        assert_eq!(log.complete_after(), 2);
        assert_eq!(since(&log, 2, 1), Since::BeyondLog { generation: 0 });
        assert_eq!(since(&log, 2, 2), Since::Unchanged);
        assert_eq!(since(&log, 1, 2), Since::Changed);
        let mut none = ChangeLog::new(0, 0);
        none.record(&key(1), 5);
        assert_eq!(since(&none, 2, 4), Since::BeyondLog { generation: 0 });
        assert_eq!(since(&none, 1, 5), Since::Unchanged);
    }

    #[test]
    fn a_backfill_extends_the_reach_only_when_it_meets_the_log_and_is_of_its_generation() {
        let mut log = ChangeLog::new(20, 100);
        log.record(&key(1), 21);
        assert!(
            !log.backfill(0, 5, 19, &[(key(2), 8)]),
            "a gap between 19 and 20"
        );
        assert!(log.backfill(0, 5, 22, &[(key(2), 8), (key(1), 21), (key(3), 22)]));
        assert_eq!(log.complete_after(), 5);
        assert_eq!(since(&log, 2, 7), Since::Changed);
        assert_eq!(since(&log, 2, 8), Since::Unchanged);
        assert_eq!(
            since(&log, 3, 21),
            Since::Changed,
            "a change after the known version"
        );
        assert_eq!(since(&log, 4, 5), Since::Unchanged);
        let generation = log.generation();
        log.restart(30);
        assert!(
            !log.backfill(generation, 1, 40, &[]),
            "read before the restart"
        );
        assert_eq!(since(&log, 2, 29), Since::BeyondLog { generation: 1 });
        assert!(log.backfill(1, 25, 30, &[]));
        assert_eq!(since(&log, 2, 25), Since::Unchanged);
    }

    #[test]
    fn a_backfill_past_the_capacity_drops_its_oldest_first() {
        let mut log = ChangeLog::new(10, 3);
        log.record(&key(1), 11);
        assert!(log.backfill(0, 0, 10, &[(key(2), 3), (key(3), 9), (key(4), 6)]));
        // Four records, three kept: (2, 3) went, so the log reaches back to 3.
        assert_eq!(log.complete_after(), 3);
        assert_eq!(since(&log, 3, 8), Since::Changed);
        assert_eq!(since(&log, 4, 6), Since::Unchanged);
    }
}
