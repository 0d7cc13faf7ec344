//! The region rule between two tables: an entry with a region is only placed on (or moved to) a
//! shard of that region, checked when the entry is written and when the shard's region is
//! changed. Each side reads the other, and under its own snapshot each would miss the other's
//! change in flight (an `eu` entry committed on a shard just turned `us`). So both take a lock
//! on the shard first, the entry's side shared (entries go on alongside each other), the
//! region's side exclusive, held to commit, and read the other table as it is committed now,
//! not as their snapshot showed it: whichever comes second sees the first.

use pgrx::prelude::*;

use super::row::Entry;
use crate::catalog;
use crate::entity::EntityKey;

/// Takes the region rule's lock on `shard` (as an object: `pg_locks.locktype = 'object'`, on
/// the registry's OID and the name's hash), until the transaction ends. `exclusive` for a change
/// of the shard's region.
pub fn hold(shard: &str, exclusive: bool) {
    let mode = if exclusive {
        pg_sys::ExclusiveLock
    } else {
        pg_sys::ShareLock
    };
    // FNV-1a: the same in every backend (two names with one hash only wait for each other).
    let hash = shard.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    // SAFETY: plain values; the lock is released by PostgreSQL at the transaction's end.
    unsafe {
        pg_sys::LockDatabaseObject(
            catalog::relation(c"shards"),
            pg_sys::Oid::from(hash),
            0,
            mode as pg_sys::LOCKMODE,
        );
    }
}

/// A snapshot of what is committed now, registered while it is used.
pub struct Latest(pg_sys::Snapshot);

impl Latest {
    pub fn take() -> Latest {
        Latest(unsafe { pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot()) })
    }

    pub fn get(&self) -> pg_sys::Snapshot {
        self.0
    }
}

impl Drop for Latest {
    fn drop(&mut self) {
        unsafe { pg_sys::UnregisterSnapshot(self.0) }
    }
}

/// An entry placed on `shard` (or moving to it) whose own region is not `region`, as committed
/// now: `(key, its region)`. Read straight from the heap, needing no privilege on the table.
pub fn misplaced(shard: &str, region: &str) -> Option<(EntityKey, String)> {
    let relid = catalog::relation(c"shard_directory");
    let latest = Latest::take();
    // SAFETY: the relation is open under AccessShareLock across the scan; each tuple is read
    // while the scan is on it.
    unsafe {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(relid, lock);
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::InvalidOid,
            false,
            latest.get(),
            0,
            std::ptr::null_mut(),
        );
        let mut found = None;
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            let entry = Entry::read(tuple, (*rel).rd_att);
            let placed = entry.placement.shard_name == shard
                || entry.placement.target_shard.as_deref() == Some(shard);
            match entry.region {
                Some(own) if placed && own != region => {
                    found = Some((entry.key, own));
                    break;
                }
                _ => {}
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, lock);
        found
    }
}
