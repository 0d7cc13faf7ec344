//! The newest version each directory database has bumped to, in shared memory when the library
//! is in `shared_preload_libraries`: a statement expects its version from here instead of
//! reading the version row (a scan that was 4% of a one-entry change's time under `perf`). A hint
//! only: a wrong one (a bump rolled back, the extension made anew, the library not preloaded:
//! then the row is read) costs rows stamped again, never a wrong stamp.
//!
//! Next to it, where the bump left the version row: the row's page holds every version of it
//! since the page was last pruned, and a read through the primary key walks them all from the
//! oldest. A wrong place (the bump rolled back, the row moved) is never a wrong row: the table
//! holds one row, so a tuple there that the reader can see is it; otherwise the key is used.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use pgrx::{itemptr, pg_shmem_init, PgAtomic};

/// Directory databases per cluster with a slot; any more read the version row.
const SLOTS: usize = 16;

#[derive(Default)]
struct Slot {
    database: AtomicU32,
    version: AtomicI64,
    /// The version row's place, packed by pgrx's `item_pointer_to_u64`; 0 when not known (no
    /// tuple is at offset 0).
    row: AtomicU64,
}

#[derive(Default)]
pub struct Latest([Slot; SLOTS]);

unsafe impl PGRXSharedMemory for Latest {}

static SHARED: PgAtomic<Latest> = unsafe { PgAtomic::new(c"shard_directory_latest") };
static IS_SHARED: AtomicBool = AtomicBool::new(false);

pub fn init() {
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(SHARED);
        IS_SHARED.store(true, Relaxed);
    }
}

/// This database's slot, claimed on first use.
fn slot() -> Option<&'static Slot> {
    if !IS_SHARED.load(Relaxed) {
        return None;
    }
    let database = unsafe { pg_sys::MyDatabaseId }.to_u32();
    SHARED.get().0.iter().find(|s| {
        // Free (0) and claimed by us, or already ours (perhaps claimed by another backend of
        // this database just now).
        s.database
            .compare_exchange(0, database, Relaxed, Relaxed)
            .map_or_else(|holder| holder == database, |_| true)
    })
}

/// The newest version bumped in this database (committed or not), when known.
pub fn get() -> Option<i64> {
    slot().map(|s| s.version.load(Relaxed)).filter(|v| *v > 0)
}

/// Where the newest version row of this database was written, when known.
pub fn row() -> Option<pg_sys::ItemPointerData> {
    let packed = slot()?.row.load(Relaxed);
    let mut tid = pg_sys::ItemPointerData::default();
    itemptr::u64_to_item_pointer(packed, &mut tid);
    (tid.ip_posid != pg_sys::InvalidOffsetNumber).then_some(tid)
}

/// Records a bump; called under the version lock.
pub fn set(version: i64) {
    if let Some(s) = slot() {
        s.version.store(version, Relaxed);
    }
}

/// Records where a bump wrote the version row; called under the version lock.
pub fn set_row(row: pg_sys::ItemPointerData) {
    if let Some(s) = slot() {
        s.row.store(itemptr::item_pointer_to_u64(row), Relaxed);
    }
}
