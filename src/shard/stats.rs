//! Rejection counters. In shared memory when the library is in `shared_preload_libraries`
//! (counts across all backends); otherwise per backend, and `stats()` says so with a NOTICE.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use pgrx::{pg_shmem_init, PgAtomic};

use crate::error::Rejection;

pub enum Counter {
    Checks,
    Rejected(Rejection),
}

const SLOTS: usize = 1 + Rejection::ALL.len();

#[derive(Default)]
pub struct Counters([AtomicU64; SLOTS]);

unsafe impl PGRXSharedMemory for Counters {}

static SHARED: PgAtomic<Counters> = unsafe { PgAtomic::new(c"shard_directory_stats") };
static IS_SHARED: AtomicBool = AtomicBool::new(false);
static LOCAL: Counters = Counters([const { AtomicU64::new(0) }; SLOTS]);

pub fn init() {
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(SHARED);
        IS_SHARED.store(true, Ordering::Relaxed);
    }
}

fn counters() -> &'static Counters {
    if IS_SHARED.load(Ordering::Relaxed) {
        SHARED.get()
    } else {
        &LOCAL
    }
}

fn slot(c: &Counter) -> usize {
    match c {
        Counter::Checks => 0,
        Counter::Rejected(r) => 1 + Rejection::ALL.iter().position(|x| x == r).expect("listed"),
    }
}

pub fn count(c: Counter) {
    counters().0[slot(&c)].fetch_add(1, Ordering::Relaxed);
}

/// Checks performed and rejections by reason (stale, missing, frozen, moved, invalid).
#[pg_extern(volatile)]
fn stats() -> TableIterator<'static, (name!(reason, String), name!(count, i64))> {
    if !IS_SHARED.load(Ordering::Relaxed) {
        notice!(
            "shard_directory is not in shared_preload_libraries: these counts are this session's only"
        );
    }
    let c = counters();
    let rows: Vec<(String, i64)> = std::iter::once(("checks".to_owned(), slot(&Counter::Checks)))
        .chain(
            Rejection::ALL
                .iter()
                .map(|r| (r.as_str().to_owned(), slot(&Counter::Rejected(*r)))),
        )
        .map(|(name, i)| (name, c.0[i].load(Ordering::Relaxed) as i64))
        .collect();
    TableIterator::new(rows)
}
