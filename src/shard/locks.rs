//! One lock orders every check against every change of `min_accepted` or of a fence.
//!
//! A check holds ROW SHARE on `shard_settings` until its transaction ends: a weak relation lock
//! that PostgreSQL grants on the backend's fast path, so it takes no shared lock-table entry
//! however many entities a transaction writes. Raising `min_accepted` and changing a fence take
//! EXCLUSIVE on the same table: they wait for the checked transactions in flight, and a check
//! that starts meanwhile waits for the change to commit, then sees it. The price is that a fence
//! change waits for every checked transaction of the shard, not only its entity's, and holds new
//! ones back while it waits; `shard_directory.fence_wait_timeout` bounds that wait.

use std::cell::Cell;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

use crate::error::{spi, SdError};
use crate::{guc, privilege};

thread_local! {
    /// The local transaction that holds the check's lock, and the table it is on, once it does.
    /// The lock is held to the transaction's end (nothing here releases it), so later checks of
    /// that transaction need not ask the lock manager again (a hash lookup and a resource-owner
    /// entry per call); a subtransaction's abort, which releases what the subtransaction took,
    /// forgets it.
    static HELD_BY: Cell<(pg_sys::LocalTransactionId, pg_sys::Oid)> =
        const { Cell::new((pg_sys::InvalidLocalTransactionId, pg_sys::InvalidOid)) };
}

pub(crate) fn local_transaction() -> pg_sys::LocalTransactionId {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    let lxid = unsafe { (*pg_sys::MyProc).lxid };
    // 17 keeps it with the backend's virtual transaction id.
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    let lxid = unsafe { (*pg_sys::MyProc).vxid.lxid };
    lxid
}

/// Called by `crate::xact` while a subtransaction is rolled back: it released the lock if it
/// was the one that took it, so the next check asks again.
pub fn forget() {
    HELD_BY.set((pg_sys::InvalidLocalTransactionId, pg_sys::InvalidOid));
}

/// Holds the check's lock until the end of the transaction; a change committed before it was
/// granted has reached this backend's invalidations when it returns.
pub fn check(settings: pg_sys::Oid) {
    let held = (local_transaction(), settings);
    if HELD_BY.get() == held {
        return;
    }
    unsafe { pg_sys::LockRelationOid(settings, pg_sys::RowShareLock as pg_sys::LOCKMODE) };
    HELD_BY.set(held);
}

/// Takes the exclusive lock for `what` (a fence change, a raise), waiting at most
/// `shard_directory.fence_wait_timeout`; past it, an error naming the backends it waited for.
pub fn exclusive(settings: pg_sys::Oid, what: impl FnOnce() -> String) {
    let mode = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
    if unsafe { pg_sys::ConditionalLockRelationOid(settings, mode) } {
        return;
    }
    let (what, blockers) = (what(), holders(settings));
    let timeout = guc::FENCE_WAIT_TIMEOUT.get();
    let value = std::ffi::CString::new(timeout.to_string()).unwrap_or_default();
    let nest = unsafe { pg_sys::NewGUCNestLevel() };
    unsafe {
        pg_sys::set_config_option(
            c"lock_timeout".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
    }
    PgTryBuilder::new(|| unsafe { pg_sys::LockRelationOid(settings, mode) })
        .catch_when(
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
            |_: CaughtError| {
                SdError::FenceWaitTimeout {
                    what: what.clone(),
                    waited_ms: timeout,
                    blockers: blockers.clone(),
                }
                .raise()
            },
        )
        .execute();
    unsafe { pg_sys::AtEOXact_GUC(true, nest) };
}

/// The backends holding a lock on `settings` that conflicts with EXCLUSIVE, with their state,
/// and the prepared transactions holding one (no backend: only COMMIT PREPARED or ROLLBACK
/// PREPARED of its gid ends it).
fn holders(settings: pg_sys::Oid) -> String {
    let database = unsafe { pg_sys::MyDatabaseId };
    privilege::as_owner_of(settings, || {
        spi(
            "list the transactions a fence waits for",
            Spi::get_one_with_args::<String>(
                "SELECT string_agg(CASE WHEN l.pid IS NULL \
                          THEN format('prepared transaction %L', coalesce(p.gid, l.virtualtransaction)) \
                          ELSE format('pid %s (%s)', l.pid, coalesce(a.state, 'unknown')) END, \
                        ', ' ORDER BY l.pid, p.gid) \
                 FROM (SELECT DISTINCT pid, virtualtransaction FROM pg_catalog.pg_locks \
                       WHERE locktype = 'relation' AND database = $1 AND relation = $2 AND granted \
                         AND mode <> 'AccessShareLock' \
                         AND pid IS DISTINCT FROM pg_catalog.pg_backend_pid()) l \
                 LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
                 LEFT JOIN (SELECT DISTINCT x.virtualtransaction, px.gid \
                            FROM pg_catalog.pg_locks x JOIN pg_catalog.pg_prepared_xacts px \
                              ON x.locktype = 'transactionid' AND x.transactionid = px.transaction) p \
                   ON l.pid IS NULL AND p.virtualtransaction = l.virtualtransaction",
                &[database.into(), settings.into()],
            ),
        )
    })
    .unwrap_or_else(|| "none left by the time it looked".to_owned())
}
