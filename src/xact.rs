//! Transaction callbacks: the directory's changes versioned at pre-commit, and the backend-local
//! state that must not outlive what it belongs to: the directory's statement frames (a
//! transaction's, and a subtransaction's), the shard check's memory of holding its lock (which a
//! rolled-back subtransaction may have released) and the mover's fence bypass.

use pgrx::prelude::*;

#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    match event {
        // After the last row lock the transaction takes (deferred triggers have fired): its
        // directory changes get their versions now.
        XACT_EVENT_PRE_COMMIT => crate::directory::version::settle(),
        XACT_EVENT_PRE_PREPARE => crate::directory::version::refuse_prepare(),
        _ => {}
    }
    if matches!(
        event,
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE | XACT_EVENT_PARALLEL_ABORT
    ) {
        crate::directory::version::clear();
        crate::shard::bypass::clear();
    }
}

/// `ROLLBACK TO SAVEPOINT`, and a PL/pgSQL `EXCEPTION` block catching an error: what the
/// subtransaction opened is gone with it (its bump, its locks, its queued notification), so its
/// frames go too, and the next statement at that level opens its own; the shard check asks for
/// its lock again.
#[pg_guard]
unsafe extern "C-unwind" fn on_subxact_end(
    event: pg_sys::SubXactEvent::Type,
    _sub: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    match event {
        pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => {
            crate::directory::version::abort_subtransaction();
            crate::shard::locks::forget();
        }
        pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => {
            crate::directory::version::commit_subtransaction();
        }
        _ => {}
    }
}

pub fn init() {
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_end), std::ptr::null_mut());
    }
}
