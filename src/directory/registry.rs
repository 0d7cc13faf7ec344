//! The rules between the shard registry (`shards`) and what names its shards: a shard named by
//! an entry (as its shard or its target) or by an open move stays registered, and where an
//! entry and its shard both have a region they match. Checked when an entry is written, and
//! when a shard is removed, renamed or given another region.
//!
//! Each side reads the other, and under its own snapshot each would miss the other's change in
//! flight (an entry committed on a shard just removed, or an `eu` entry on a shard just turned
//! `us`). So both take a lock on the shard first, the entry's side shared (entries go on
//! alongside each other), the registry's side exclusive, held to commit, and read the other
//! table as it is committed now, not as their snapshot showed it: whichever comes second sees
//! the first. These are the rules, not foreign keys: a parallel `pg_restore` loads the
//! directory's tables side by side, in no order a key could wait for (pg_dump orders the data of
//! an extension's tables by their keys, but records no dependency a parallel restore follows),
//! and a restored entry is taken as its dump had it.

use std::ffi::CStr;

use pgrx::prelude::*;

use super::row::{self, Entry};
use crate::catalog;
use crate::entity::EntityKey;
use crate::error::SdError;

/// Takes the lock on `shard` (as an object: `pg_locks.locktype = 'object'`, on the registry's
/// OID and the name's hash), until the transaction ends: shared to name the shard, `exclusive`
/// to remove it or change its region.
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

/// The first answer `visit` gives for a row of `shard_directory.<table>` as committed now. Read
/// straight from the heap, needing no privilege on the table.
fn find_committed<R>(
    table: &'static CStr,
    mut visit: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc) -> Option<R>,
) -> Option<R> {
    let relid = catalog::relation(table);
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
        while found.is_none() {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            found = visit(tuple, (*rel).rd_att);
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, lock);
        found
    }
}

/// An entry placed on `shard` (or moving to it) whose own region is not `region`, as committed
/// now: `(key, its region)`.
pub fn misplaced(shard: &str, region: &str) -> Option<(EntityKey, String)> {
    find_committed(c"shard_directory", |tuple, desc| {
        // SAFETY: a tuple of the scan, which `desc` describes.
        let entry = unsafe { Entry::read(tuple, desc) };
        let placed = entry.placement.shard_name == shard
            || entry.placement.target_shard.as_deref() == Some(shard);
        match entry.region {
            Some(own) if placed && own != region => Some((entry.key, own)),
            _ => None,
        }
    })
}

/// What keeps `shard` registered, as committed now: an entry placed on it or moving to it, or
/// an open move from or to it. Named as an error message names it.
pub fn user(shard: &str) -> Option<String> {
    let entry = find_committed(c"shard_directory", |tuple, desc| {
        // SAFETY: a tuple of the scan, which `desc` describes.
        let entry = unsafe { Entry::read(tuple, desc) };
        let placed = entry.placement.shard_name == shard
            || entry.placement.target_shard.as_deref() == Some(shard);
        placed.then(|| format!("the directory entry {}", entry.key))
    });
    entry.or_else(|| {
        find_committed(c"shard_moves", |tuple, desc| {
            let [id, entity_type, entity_id, source, target, finished] = row::positions(
                desc,
                [
                    c"move_id",
                    c"entity_type",
                    c"entity_id",
                    c"source_shard",
                    c"target_shard",
                    c"finished_at",
                ],
            );
            let get = |at: usize| {
                let mut is_null = false;
                // SAFETY: a tuple of the scan, which `desc` describes; `at` is one of its
                // columns, of the type `positions` checked.
                let datum = unsafe { pg_sys::heap_getattr(tuple, at as i32, desc, &mut is_null) };
                (!is_null).then_some(datum)
            };
            let text = |at| get(at).and_then(|d| unsafe { String::from_datum(d, false) });
            let open = get(finished).is_none();
            let named = [text(source), text(target)].contains(&Some(shard.to_owned()));
            (open && named).then(|| {
                let id = get(id).and_then(|d| unsafe { i64::from_datum(d, false) });
                let key = EntityKey {
                    entity_type: text(entity_type).unwrap_or_default(),
                    entity_id: text(entity_id).unwrap_or_default(),
                };
                format!("the open move {} of {key}", id.unwrap_or_default())
            })
        })
    })
}

/// Every shard `entry` names must be registered, and in the entry's region when both have one.
pub fn check(entry: &Entry) -> Result<(), SdError> {
    let named = [
        Some(&entry.placement.shard_name),
        entry.placement.target_shard.as_ref(),
    ];
    for shard in named.into_iter().flatten() {
        // Held until this transaction ends, and read as committed now: the shard is not
        // removed, nor its region changed, under an entry that names it.
        hold(shard, false);
        let found = shard_region(shard, &Latest::take());
        match found {
            None => {
                return Err(SdError::UnknownShard {
                    entity: entry.key.clone(),
                    shard: shard.clone(),
                })
            }
            Some(Some(shard_region)) => match &entry.region {
                Some(entity_region) if *entity_region != shard_region => {
                    return Err(SdError::RegionMismatch {
                        entity: entry.key.clone(),
                        entity_region: entity_region.clone(),
                        shard: shard.clone(),
                        shard_region,
                    })
                }
                _ => {}
            },
            Some(None) => {}
        }
    }
    Ok(())
}

/// The region of the registered shard `shard` (`None`: not registered; `Some(None)`: it has no
/// region). Read straight through the registry's primary key, not through SQL: it is on every
/// change's path, and with no statement there is no name or operator to resolve, so it needs
/// neither the owner's rights nor a pinned `search_path`. It sees what is committed now.
fn shard_region(shard: &str, latest: &Latest) -> Option<Option<String>> {
    let relid = catalog::relation(c"shards");
    let key_datum = shard.into_datum().expect("text is never NULL");
    // SAFETY: the relation is opened and closed here under AccessShareLock; the scan key, the
    // snapshot (registered by the caller) and the tuple live across their use.
    unsafe {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(relid, lock);
        // Found in the open relation's descriptor: no catalog lookup per change.
        let desc = (*rel).rd_att;
        let [name_column, region_column] = row::positions(desc, [c"shard_name", c"region"]);
        let mut key = std::mem::MaybeUninit::<pg_sys::ScanKeyData>::zeroed().assume_init();
        pg_sys::ScanKeyInit(
            &mut key,
            name_column as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            key_datum,
        );
        // Compare as the index orders: in the column's collation, not ScanKeyInit's C.
        key.sk_collation = crate::catalog::attributes(desc)[name_column - 1].attcollation;
        let scan = pg_sys::systable_beginscan(
            rel,
            crate::catalog::primary_key_index(rel),
            true,
            latest.get(),
            1,
            &mut key,
        );
        let tuple = pg_sys::systable_getnext(scan);
        let found = (!tuple.is_null()).then(|| {
            let mut is_null = false;
            let datum =
                pg_sys::heap_getattr(tuple, region_column as i32, (*rel).rd_att, &mut is_null);
            String::from_datum(datum, is_null)
        });
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, lock);
        found
    }
}
