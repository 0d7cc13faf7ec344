//! Load per entity: the checked transactions of each entity, over a window, so that an operator
//! (and `shard-directory rebalance --by load`) can see which tenants are hot.
//!
//! The check already knows the entity a transaction declared (and the row trigger each row's), so
//! counting costs, once per transaction and entity, a hash and an atomic add: a fixed table of
//! [`SLOTS`] entities, each found by its 64-bit hash in one of [`WAYS`] slots. Only a newcomer
//! (or the turn of the window) takes the table's lock: one whose slots are all taken replaces
//! the least busy of them at one transaction in [`ADMIT_ONE_IN`] (its others go uncounted), so
//! a busy entity keeps its slot, and gets one within a few transactions, while quiet ones come
//! and go; its count then runs from `since`. A count racing with the replacement of its slot may land on the
//! newcomer: the counts are at least as exact as the window. The table is in shared memory when
//! the library is in `shared_preload_libraries` (every backend's transactions); otherwise each
//! backend counts its own, and `entity_stats()` says so.
//!
//! The window (`shard_directory.entity_stats_window`) turns over as a whole: the counts of the
//! window before the current one are kept beside the current ones, and `entity_stats()` reports
//! both together, so what it shows always covers between one and two windows.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};

use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use pgrx::{pg_shmem_init, PgAtomic, PgLwLock};

use crate::entity::EntityRef;
use crate::guc;

/// Entities the table holds at once.
pub const SLOTS: usize = 1024;
/// Slots an entity may occupy: its hash's, and the next ones.
const WAYS: usize = 8;
/// Bytes of `entity_type` and `entity_id` kept per slot; a longer key is shown cut, with `…`.
const KEY_BYTES: usize = 128;
/// Entities a transaction remembers having counted.
const REMEMBERED: usize = 16;

const MICROS: i64 = 1_000_000;
/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH: i64 = 946_684_800;

/// One entity's counts; `hash` 0 is a free slot.
struct Count {
    hash: AtomicU64,
    /// Transactions in the current window, and in the one before it.
    current: AtomicU64,
    previous: AtomicU64,
    /// When the entity took this slot (`TimestampTz`).
    since: AtomicI64,
}

impl Count {
    fn total(&self) -> u64 {
        self.current.load(Relaxed) + self.previous.load(Relaxed)
    }
}

/// The counts, read and added to without a lock.
pub struct Counts {
    /// Start of the current window (`TimestampTz`); 0 before the first count.
    window_start: AtomicI64,
    slots: [Count; SLOTS],
}

unsafe impl PGRXSharedMemory for Counts {}

impl Default for Counts {
    fn default() -> Counts {
        Counts {
            window_start: AtomicI64::new(0),
            slots: std::array::from_fn(|_| Count {
                hash: AtomicU64::new(0),
                current: AtomicU64::new(0),
                previous: AtomicU64::new(0),
                since: AtomicI64::new(0),
            }),
        }
    }
}

/// Each slot's entity, as text: written and read under the lock only.
#[derive(Clone, Copy)]
struct Key {
    type_len: u16,
    len: u16,
    cut: bool,
    bytes: [u8; KEY_BYTES],
}

pub struct Keys([Key; SLOTS]);

unsafe impl PGRXSharedMemory for Keys {}

impl Default for Keys {
    fn default() -> Keys {
        Keys(
            [Key {
                type_len: 0,
                len: 0,
                cut: false,
                bytes: [0; KEY_BYTES],
            }; SLOTS],
        )
    }
}

impl Key {
    fn set(&mut self, key: EntityRef<'_>) {
        let kept_type = cut_at_char(key.entity_type, KEY_BYTES / 2);
        let kept_id = cut_at_char(key.entity_id, KEY_BYTES - kept_type);
        let (t, id) = (key.entity_type.as_bytes(), key.entity_id.as_bytes());
        self.type_len = kept_type as u16;
        self.len = (kept_type + kept_id) as u16;
        self.cut = kept_type < t.len() || kept_id < id.len();
        self.bytes[..kept_type].copy_from_slice(&t[..kept_type]);
        self.bytes[kept_type..kept_type + kept_id].copy_from_slice(&id[..kept_id]);
    }

    fn text(&self) -> (String, String) {
        let (t, id) = self.bytes[..self.len as usize].split_at(self.type_len as usize);
        let cut = if self.cut { "…" } else { "" };
        (
            String::from_utf8_lossy(t).into_owned(),
            String::from_utf8_lossy(id).into_owned() + cut,
        )
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn cut_at_char(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// FNV-1a over the type, a separator no text contains, and the id; never 0 (a free slot). Two
/// entities are one to the counts only if their 64-bit hashes collide.
fn hash(key: EntityRef<'_>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = key
        .entity_type
        .bytes()
        .chain([0])
        .chain(key.entity_id.bytes());
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

fn ways(hash: u64) -> impl Iterator<Item = usize> {
    let first = hash as usize % SLOTS;
    (0..WAYS).map(move |way| (first + way) % SLOTS)
}

impl Counts {
    /// Adds one to the entity's count, without a lock. Otherwise says why not: the window must
    /// turn first, or the entity has no slot (with a free one among its ways, or none).
    fn bump(&self, hash: u64, now: i64, window: i64) -> Bump {
        let start = self.window_start.load(Acquire);
        if start == 0 || now >= start + window {
            return Bump::Turn;
        }
        let mut free = false;
        for i in ways(hash) {
            match self.slots[i].hash.load(Acquire) {
                h if h == hash => {
                    self.slots[i].current.fetch_add(1, Relaxed);
                    return Bump::Counted;
                }
                0 => free = true,
                _ => {}
            }
        }
        if free {
            Bump::Free
        } else {
            Bump::Full
        }
    }

    /// Under the lock: turns the window if due, then counts the entity, in a slot of its own if
    /// it has none.
    fn place(&self, keys: &mut Keys, hash: u64, key: EntityRef<'_>, now: i64, window: i64) {
        self.turn(now, window);
        if self.bump(hash, now, window) == Bump::Counted {
            return;
        }
        let victim = ways(hash)
            .min_by_key(|&i| {
                let s = &self.slots[i];
                (s.hash.load(Relaxed) != 0, s.total())
            })
            .expect("WAYS > 0");
        let slot = &self.slots[victim];
        slot.hash.store(0, Release);
        keys.0[victim].set(key);
        slot.current.store(1, Relaxed);
        slot.previous.store(0, Relaxed);
        slot.since.store(now, Relaxed);
        slot.hash.store(hash, Release);
    }

    /// Under the lock: when `now` is past the current window, the current counts become the
    /// previous ones (none, when a whole window went by without a count), and an entity with no
    /// transaction in either gives its slot back.
    fn turn(&self, now: i64, window: i64) {
        let start = self.window_start.load(Acquire);
        if start == 0 {
            self.window_start.store(now, Release);
            return;
        }
        if now < start + window {
            return;
        }
        let skipped = (now - start) / window;
        for slot in self.slots.iter().filter(|s| s.hash.load(Relaxed) != 0) {
            let current = slot.current.swap(0, Relaxed);
            let previous = if skipped == 1 { current } else { 0 };
            slot.previous.store(previous, Relaxed);
            if previous == 0 {
                slot.hash.store(0, Release);
            }
        }
        self.window_start.store(start + skipped * window, Release);
    }

    /// Under the lock (shared): the `top` entities by transactions per second, as of `now`.
    fn top(&self, keys: &Keys, top: usize, now: i64, window: i64) -> Vec<Row> {
        let start = self.window_start.load(Acquire);
        let (previous_start, keeps_previous) = match (now - start) / window.max(1) {
            0 => (start - window, true),
            1 => (start, false),
            _ => return Vec::new(),
        };
        let mut rows: Vec<Row> = (0..SLOTS)
            .filter(|&i| self.slots[i].hash.load(Acquire) != 0)
            .filter_map(|i| {
                let s = &self.slots[i];
                let transactions = if keeps_previous {
                    s.total()
                } else {
                    s.current.load(Relaxed)
                };
                let since = s.since.load(Relaxed).max(previous_start);
                let seconds = ((now - since) as f64 / MICROS as f64).max(1.0);
                let (entity_type, entity_id) = keys.0[i].text();
                (transactions > 0).then(|| Row {
                    entity_type,
                    entity_id,
                    transactions: transactions as i64,
                    per_second: transactions as f64 / seconds,
                    since,
                })
            })
            .collect();
        rows.sort_by(|a, b| {
            (b.per_second.total_cmp(&a.per_second))
                .then(b.transactions.cmp(&a.transactions))
                .then_with(|| (&a.entity_type, &a.entity_id).cmp(&(&b.entity_type, &b.entity_id)))
        });
        rows.truncate(top);
        rows
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bump {
    Counted,
    Turn,
    Free,
    Full,
}

/// A newcomer whose ways are all taken replaces one of them at one miss in this many (per
/// backend): a busy entity gets its slot within a few transactions, while a stream of quiet ones
/// (more entities than [`SLOTS`], each seldom) mostly costs a lock-free look, not the lock.
const ADMIT_ONE_IN: u32 = 8;

/// Decides, for this backend, whether a miss on a full neighbourhood takes a slot.
fn admitted() -> bool {
    MISSES.with(|m| {
        let n = m.get().wrapping_add(1);
        m.set(n);
        n % ADMIT_ONE_IN == 0
    })
}

struct Row {
    entity_type: String,
    entity_id: String,
    transactions: i64,
    per_second: f64,
    since: i64,
}

/// The counts, and the keys with the lock that places entities and turns windows.
static COUNTS: PgAtomic<Counts> = unsafe { PgAtomic::new(c"shard_directory_entity_counts") };
static KEYS: PgLwLock<Keys> = unsafe { PgLwLock::new(c"shard_directory_entity_keys") };
static mut IS_SHARED: bool = false;

/// The backend's own table when the library was not preloaded (made at its first count).
type Local = Option<Box<(Counts, Keys)>>;

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(None) };
    /// Misses on a full neighbourhood, for [`admitted`].
    static MISSES: Cell<u32> = const { Cell::new(0) };
    /// The entities this backend counted in its current local transaction: a transaction is
    /// counted once per entity however many checks it makes (past [`REMEMBERED`] entities in one
    /// transaction, each check of a new one counts). The strings' buffers are reused.
    static COUNTED: RefCell<Counted> = const {
        RefCell::new(Counted { xact: pg_sys::InvalidLocalTransactionId, len: 0, keys: Vec::new() })
    };
}

struct Counted {
    xact: pg_sys::LocalTransactionId,
    len: usize,
    keys: Vec<(String, String)>,
}

impl Counted {
    /// Whether `key` is new to the transaction `xact` (and remembered from now on).
    fn first_time(&mut self, xact: pg_sys::LocalTransactionId, key: EntityRef<'_>) -> bool {
        if self.xact != xact {
            (self.xact, self.len) = (xact, 0);
        }
        let seen = &self.keys[..self.len];
        if seen
            .iter()
            .any(|(t, id)| t == key.entity_type && id == key.entity_id)
        {
            return false;
        }
        if self.len < REMEMBERED {
            if self.len == self.keys.len() {
                self.keys.push(Default::default());
            }
            let (t, id) = &mut self.keys[self.len];
            t.clear();
            t.push_str(key.entity_type);
            id.clear();
            id.push_str(key.entity_id);
            self.len += 1;
        }
        true
    }
}

pub fn init() {
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(COUNTS);
        pg_shmem_init!(KEYS);
        unsafe { IS_SHARED = true };
    }
}

fn shared() -> bool {
    unsafe { IS_SHARED }
}

fn window() -> i64 {
    i64::from(guc::ENTITY_STATS_WINDOW.get()) * MICROS
}

extern "C-unwind" {
    /// PostgreSQL's: it reads a variable and cannot raise, so it is called without pgrx's guard.
    fn GetCurrentTransactionStartTimestamp() -> pg_sys::TimestampTz;
}

/// When the counted transaction started: what it is counted at, read without a clock call (a
/// procedure's transactions each have their own).
fn transaction_start() -> i64 {
    unsafe { GetCurrentTransactionStartTimestamp() }
}

/// Now, as a `TimestampTz`, from the clock (the vDSO's: no call into PostgreSQL).
fn now() -> i64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    unix.as_micros() as i64 - POSTGRES_EPOCH * MICROS
}

/// Counts the transaction for `key`, unless it already was (or counting is off).
pub fn count(key: EntityRef<'_>) {
    if !guc::ENTITY_STATS.get() {
        return;
    }
    let xact = crate::shard::locks::local_transaction();
    if !COUNTED.with_borrow_mut(|counted| counted.first_time(xact, key)) {
        return;
    }
    let (hash, now, window) = (hash(key), transaction_start(), window());
    let needs_lock = |bump| match bump {
        Bump::Counted => false,
        Bump::Full => admitted(),
        Bump::Turn | Bump::Free => true,
    };
    if shared() {
        let counts = COUNTS.get();
        if needs_lock(counts.bump(hash, now, window)) {
            counts.place(&mut KEYS.exclusive(), hash, key, now, window);
        }
    } else {
        LOCAL.with_borrow_mut(|local| {
            let (counts, keys) = &mut **local.get_or_insert_with(Default::default);
            if needs_lock(counts.bump(hash, now, window)) {
                counts.place(keys, hash, key, now, window);
            }
        });
    }
}

/// The busiest entities of this shard: checked transactions per entity over the last one to two
/// windows of `shard_directory.entity_stats_window`, busiest (per second) first.
#[pg_extern(volatile)]
fn entity_stats(
    top: default!(i32, 20),
) -> TableIterator<
    'static,
    (
        name!(entity_type, String),
        name!(entity_id, String),
        name!(transactions, i64),
        name!(per_second, f64),
        name!(since, TimestampWithTimeZone),
    ),
> {
    let top = usize::try_from(top).unwrap_or(0);
    let rows = if shared() {
        COUNTS.get().top(&KEYS.share(), top, now(), window())
    } else {
        notice!(
            "shard_directory is not in shared_preload_libraries: these counts are this session's only"
        );
        LOCAL.with_borrow(|local| {
            local
                .as_ref()
                .map(|t| t.0.top(&t.1, top, now(), window()))
                .unwrap_or_default()
        })
    };
    TableIterator::new(rows.into_iter().map(|r| {
        (
            r.entity_type,
            r.entity_id,
            r.transactions,
            r.per_second,
            TimestampWithTimeZone::try_from(r.since)
                .unwrap_or_else(|_| TimestampWithTimeZone::negative_infinity()),
        )
    }))
}

#[cfg(test)]
mod unit {
    use super::*;

    const W: i64 = 60 * MICROS;

    fn key<'a>(t: &'a str, id: &'a str) -> EntityRef<'a> {
        EntityRef {
            entity_type: t,
            entity_id: id,
        }
    }

    struct Table(Box<(Counts, Keys)>);

    impl Table {
        fn new() -> Table {
            Table(Box::default())
        }

        fn count(&mut self, k: EntityRef<'_>, now: i64) {
            let (counts, keys) = &mut *self.0;
            if counts.bump(hash(k), now, W) != Bump::Counted {
                counts.place(keys, hash(k), k, now, W);
            }
        }

        fn top(&self, top: usize, now: i64) -> Vec<Row> {
            self.0 .0.top(&self.0 .1, top, now, W)
        }

        fn counts(&self, now: i64) -> Vec<(String, i64)> {
            self.top(SLOTS, now)
                .into_iter()
                .map(|r| (r.entity_id, r.transactions))
                .collect()
        }
    }

    #[test]
    fn a_transaction_counts_once_per_entity() {
        let mut c = Counted {
            xact: 0,
            len: 0,
            keys: Vec::new(),
        };
        assert!(c.first_time(7, key("tenant", "a")));
        assert!(!c.first_time(7, key("tenant", "a")));
        assert!(c.first_time(7, key("tenant", "b")));
        assert!(!c.first_time(7, key("tenant", "a")));
        assert!(c.first_time(7, key("account", "a")));
        assert!(c.first_time(8, key("tenant", "a")));
        assert!(c.first_time(8, key("tenant", "b")));
    }

    #[test]
    fn busiest_first_and_windows_turn_over() {
        let mut t = Table::new();
        let start = 1_000 * MICROS;
        for _ in 0..3 {
            t.count(key("tenant", "a"), start);
        }
        t.count(key("tenant", "b"), start);
        assert_eq!(t.counts(start), [("a".into(), 3), ("b".into(), 1)]);
        // The next window keeps the last one's counts beside its own.
        t.count(key("tenant", "b"), start + W);
        t.count(key("tenant", "b"), start + W);
        assert_eq!(t.counts(start + W), [("a".into(), 3), ("b".into(), 3)]);
        // A window with no transaction of `a` later, `a` is gone; two quiet windows, everyone.
        t.count(key("tenant", "b"), start + 2 * W);
        assert_eq!(t.counts(start + 2 * W), [("b".into(), 3)]);
        assert_eq!(t.counts(start + 4 * W), []);
        t.count(key("tenant", "c"), start + 5 * W);
        assert_eq!(t.counts(start + 5 * W), [("c".into(), 1)]);
    }

    #[test]
    fn a_busy_entity_keeps_its_slot_when_the_table_is_full() {
        let mut t = Table::new();
        let now = 1_000 * MICROS;
        for _ in 0..100 {
            t.count(key("tenant", "hot"), now);
        }
        for i in 0..(SLOTS * 4) {
            t.count(key("tenant", &i.to_string()), now);
        }
        let top = t.top(1, now);
        assert_eq!(
            (top[0].entity_id.as_str(), top[0].transactions),
            ("hot", 100)
        );
        let taken = t.0 .0.slots.iter().filter(|s| s.hash.load(Relaxed) != 0);
        assert_eq!(taken.count(), SLOTS);
    }

    #[test]
    fn types_and_long_ids_are_kept_apart() {
        let mut t = Table::new();
        let now = 1_000 * MICROS;
        let long = "é".repeat(100);
        t.count(key("tenant", "1"), now);
        t.count(key("account", "1"), now);
        t.count(key("tenant", &long), now);
        t.count(key("tenant", &long), now);
        let rows = t.top(10, now);
        let cut = &rows[0];
        assert_eq!(cut.transactions, 2);
        let kept = cut.entity_id.trim_end_matches('…');
        assert!(cut.entity_id.ends_with('…') && long.starts_with(kept));
        let mut types: Vec<_> = rows[1..].iter().map(|r| r.entity_type.as_str()).collect();
        types.sort();
        assert_eq!(types, ["account", "tenant"]);
    }
}
