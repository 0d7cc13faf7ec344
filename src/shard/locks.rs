//! Transaction-level locks that order checks against fences.
//!
//! A check holds a shared lock on the shard-wide setting (a row-share lock on `shard_settings`,
//! which PostgreSQL takes on its fast path) and, for an entity, a shared lock on that entity, until
//! commit. Raising `min_accepted` takes the exclusive lock on `shard_settings`; fencing an entity
//! takes the exclusive lock on the entity. So a fence waits for the checked transactions already
//! in flight, and a check that starts after the fence began waits for it to commit, then reads it.

use std::hash::{DefaultHasher, Hash, Hasher};

use pgrx::pg_sys;

use crate::entity::EntityKey;

/// `locktag_field4` of our entity locks: advisory locks taken with `pg_advisory_*` use 1 or 2, so
/// ours never collide with an application's.
const ENTITY_LOCK_SPACE: u16 = 0x5344;

#[derive(Clone, Copy)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// Locks the shard-wide setting; also processes pending cache invalidations.
pub fn shard_wide(settings: pg_sys::Oid, mode: Mode) {
    let lockmode = match mode {
        Mode::Shared => pg_sys::RowShareLock,
        Mode::Exclusive => pg_sys::ExclusiveLock,
    };
    unsafe { pg_sys::LockRelationOid(settings, lockmode as pg_sys::LOCKMODE) };
}

/// Locks one entity until the end of the transaction, then processes pending invalidations so a
/// fence committed while we waited is seen.
pub fn entity(key: &EntityKey, mode: Mode) {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    let hash = h.finish();
    let tag = pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (hash >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: ENTITY_LOCK_SPACE,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    let lockmode = match mode {
        Mode::Shared => pg_sys::ShareLock,
        Mode::Exclusive => pg_sys::ExclusiveLock,
    };
    unsafe {
        pg_sys::LockAcquire(&tag, lockmode as pg_sys::LOCKMODE, false, false);
        pg_sys::AcceptInvalidationMessages();
    }
}
