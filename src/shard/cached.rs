//! Per-backend cache of `min_accepted` and the fences, exactly as fresh as a query.
//!
//! Every change to `shard_settings` or `shard_fences` (through the functions or by hand) goes
//! through a trigger that takes the exclusive lock and registers a relcache invalidation for the
//! table; PostgreSQL sends it at commit, before the lock is released. A check takes its shared lock
//! first and processes invalidations after, so a change that committed before the check's lock was
//! granted has always reached this cache. Misses read under the latest committed snapshot (not the
//! transaction's, which may predate the fence in REPEATABLE READ, or the statement's, taken before
//! the lock wait).

use std::cell::{Cell, RefCell};
// foldhash: every check looks its entity up here, and SipHash was most of that lookup's cost.
use foldhash::{HashMap, HashSet};
use std::ffi::CStr;
use std::rc::Rc;

use pgrx::pg_sys;
use pgrx::prelude::*;

use super::key::{self, KeyColumn};
use crate::entity::{EntityKey, EntityRef};
use crate::error::{spi, SdError};
use crate::{catalog, privilege};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    Owned {
        min_version: i64,
    },
    /// Every write refused (every read too unless `reads`); with a lease, only until it ends.
    /// A move's freeze lets reads through, as its source holds every row; its cutover (state
    /// `cutover`, while the directory commits it) does not, so that nobody reads the source
    /// once the target may be written.
    Frozen {
        lease: Option<Lease>,
        reads: bool,
    },
    Moved {
        moved_to: String,
        version: i64,
    },
}

/// A freeze that ends by itself: a mover that vanished cannot leave its entity frozen for good.
/// Past `until` the fence is `Owned { min_version }`, with `min_version` one above the
/// directory's freeze version, so only a client that saw a directory change after the freeze
/// (the freeze released, or the cutover, which routes it elsewhere) gets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// A `TimestampTz` (microseconds since 2000-01-01), read on this server's clock.
    pub until: i64,
    pub min_version: i64,
}

impl Fence {
    /// The fence as it stands now: a frozen fence whose lease has ended is its `Owned` form.
    fn in_force(self) -> Fence {
        match self {
            Fence::Frozen { lease: Some(l), .. }
                if unsafe { pg_sys::GetCurrentTimestamp() } >= l.until =>
            {
                Fence::Owned {
                    min_version: l.min_version,
                }
            }
            f => f,
        }
    }
}

/// The fences of one entity type, and what a declared id of that type is checked against.
#[derive(Default)]
struct TypeFences {
    /// By entity id: looked up with borrowed strings.
    by_id: HashMap<String, Fence>,
    /// The key columns of the type's protected tables: a declared id must be canonical for them,
    /// or it could miss the fence its rows' keys find.
    keys: Vec<KeyColumn>,
    /// Declared ids already found canonical (bounded; emptied with the cache).
    canonical: RefCell<HashSet<String>>,
}

/// Fences by entity type.
type Fences = HashMap<String, TypeFences>;

/// How many canonical declared ids a backend remembers per entity type before it starts over.
const CANONICAL_MEMO: usize = 4096;

#[derive(Clone, Copy)]
pub struct Tables {
    pub settings: pg_sys::Oid,
    pub fences: pg_sys::Oid,
}

#[derive(Default)]
struct Cache {
    tables: Option<Tables>,
    min_accepted: Option<i64>,
    /// Every fence on this shard: fences are few (entities mid-move or recently moved), and
    /// holding them all makes the common answer, "no fence", free.
    fences: Option<Rc<Fences>>,
    /// `INVALIDATIONS` when this cache was last known valid.
    seen: u64,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
    /// Bumped by the relcache callback; the callback may run while the cache is borrowed, so it
    /// only touches this counter.
    static INVALIDATIONS: Cell<u64> = const { Cell::new(0) };
    static WATCHED: Cell<(pg_sys::Oid, pg_sys::Oid)> = const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let (settings, fences) = WATCHED.get();
    if relid == pg_sys::InvalidOid || relid == settings || relid == fences {
        INVALIDATIONS.set(INVALIDATIONS.get() + 1);
    }
}

pub fn init() {
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache), pg_sys::Datum::from(0)) };
}

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    CACHE.with_borrow_mut(|c| {
        let now = INVALIDATIONS.get();
        if c.seen != now {
            // The tables themselves may have been dropped and re-created: forget their OIDs too.
            *c = Cache {
                seen: now,
                ..Cache::default()
            };
        }
        f(c)
    })
}

/// The OIDs of `shard_settings` and `shard_fences` in this database.
pub fn tables() -> Tables {
    if let Some(t) = with_cache(|c| c.tables) {
        return t;
    }
    let t = Tables {
        settings: catalog::relation(c"shard_settings"),
        fences: catalog::relation(c"shard_fences"),
    };
    WATCHED.set((t.settings, t.fences));
    with_cache(|c| c.tables = Some(t));
    t
}

/// Tables were protected or unprotected: every backend forgets its fences (which hold the key
/// columns of each fenced type) when this transaction commits.
pub fn protection_changed() {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(tables().fences) };
}

/// Runs a query under the latest committed snapshot, as the owner of the extension's tables (the
/// check works for any role); the columns come back as text.
fn latest_rows(sql: &CStr) -> Vec<Vec<Option<String>>> {
    privilege::as_owner_of(tables().settings, || unsafe {
        spi("read shard state", Spi::check_status(pg_sys::SPI_connect()));
        let plan = pg_sys::SPI_prepare(sql.as_ptr(), 0, std::ptr::null_mut());
        if plan.is_null() {
            SdError::ObjectMissing {
                name: sql.to_string_lossy().into_owned(),
            }
            .raise();
        }
        let rc = pg_sys::SPI_execute_snapshot(
            plan,
            std::ptr::null_mut(),
            std::ptr::null(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            true,
            false,
            0,
        );
        spi("read shard state", Spi::check_status(rc));
        let table = *pg_sys::SPI_tuptable;
        let natts = (*table.tupdesc).natts;
        let rows = (0..pg_sys::SPI_processed as usize)
            .map(|r| {
                let tuple = *table.vals.add(r);
                (1..=natts)
                    .map(|i| {
                        let v = pg_sys::SPI_getvalue(tuple, table.tupdesc, i);
                        (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
                    })
                    .collect()
            })
            .collect();
        pg_sys::SPI_finish();
        rows
    })
}

fn int(v: &Option<String>) -> i64 {
    spi(
        "read an integer column of the shard state",
        v.as_deref().unwrap_or("").parse::<i64>(),
    )
}

/// Loads with `load` unless cached. A value read while an invalidation arrived is used for this
/// call (the caller's lock makes it right for the caller) but not cached: it may predate the change
/// that invalidation announced for something the caller does not hold.
fn cached<T: Clone>(get: impl Fn(&mut Cache) -> &mut Option<T>, load: impl FnOnce() -> T) -> T {
    if let Some(v) = with_cache(|c| get(c).clone()) {
        return v;
    }
    let before = INVALIDATIONS.get();
    let v = load();
    with_cache(|c| {
        if c.seen == before {
            *get(c) = Some(v.clone());
        }
    });
    v
}

/// The shard-wide minimum version. Call with the shard-wide lock held.
pub fn min_accepted() -> i64 {
    cached(
        |c| &mut c.min_accepted,
        || {
            let rows = latest_rows(c"SELECT min_accepted FROM shard_directory.shard_settings");
            match rows.first() {
                Some(row) => int(&row[0]),
                None => SdError::SingletonMissing {
                    table: "shard_settings",
                }
                .raise(),
            }
        },
    )
}

/// The entity's fence on this shard, if any. Call with the check's lock held.
pub fn fence(key: EntityRef<'_>) -> Option<Fence> {
    let fence = fences()
        .get(key.entity_type)?
        .by_id
        .get(key.entity_id)
        .cloned();
    fence.map(Fence::in_force)
}

/// Refuses an id a client declared (`app.entity_id`) that is not canonical for the key columns of
/// its type, when that type has fences here: `08842` would miss the fence of `8842`, whose rows
/// it reads. Types without fences have nothing such an id could miss.
pub fn require_canonical_declared(key: EntityRef<'_>) {
    let all = fences();
    let Some(of_type) = all.get(key.entity_type) else {
        return;
    };
    if of_type.canonical.borrow().contains(key.entity_id) {
        return;
    }
    key::require_canonical(key.entity_type, key.entity_id, &of_type.keys);
    let mut memo = of_type.canonical.borrow_mut();
    if memo.len() >= CANONICAL_MEMO {
        memo.clear();
    }
    memo.insert(key.entity_id.to_owned());
}

/// An entity of `entity_type` fenced frozen (first) or moved, if there is one.
pub fn frozen_or_moved(entity_type: &str) -> Option<(EntityKey, &'static str)> {
    let all = fences();
    let of_type = &all.get(entity_type)?.by_id;
    let first = |wanted: fn(&Fence) -> bool| {
        of_type
            .iter()
            .filter(|(_, f)| wanted(&(*f).clone().in_force()))
            .map(|(id, _)| id)
            .min()
            .map(|id| EntityKey {
                entity_type: entity_type.to_owned(),
                entity_id: id.clone(),
            })
    };
    first(|f| matches!(f, Fence::Frozen { .. }))
        .map(|k| (k, "frozen"))
        .or_else(|| first(|f| matches!(f, Fence::Moved { .. })).map(|k| (k, "moved")))
}

fn fences() -> Rc<Fences> {
    cached(
        |c| &mut c.fences,
        || {
            let rows = latest_rows(
                c"SELECT entity_type, entity_id, state, min_version, moved_to, \
                  ((extract(epoch FROM lease_until) - 946684800) * 1000000)::int8 \
                  FROM shard_directory.shard_fences",
            );
            let mut fences = Fences::default();
            for row in rows {
                let fence = match row[2].as_deref() {
                    Some(state @ ("frozen" | "cutover")) => Fence::Frozen {
                        lease: row[5].as_ref().map(|_| Lease {
                            until: int(&row[5]),
                            min_version: int(&row[3]),
                        }),
                        reads: state == "frozen",
                    },
                    Some("moved") => Fence::Moved {
                        moved_to: row[4].clone().unwrap_or_default(),
                        version: int(&row[3]),
                    },
                    _ => Fence::Owned {
                        min_version: int(&row[3]),
                    },
                };
                fences
                    .entry(row[0].clone().unwrap_or_default())
                    .or_default()
                    .by_id
                    .insert(row[1].clone().unwrap_or_default(), fence);
            }
            for (entity_type, of_type) in fences.iter_mut() {
                of_type.keys =
                    privilege::as_owner_of(tables().settings, || key::columns_of(entity_type));
            }
            Rc::new(fences)
        },
    )
}
