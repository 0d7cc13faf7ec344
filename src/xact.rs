//! One transaction-end callback for the backend-local state that must not outlive its
//! transaction: the directory's statement frames and the mover's fence bypass.

use pgrx::prelude::*;

#[pg_guard]
unsafe extern "C-unwind" fn on_xact_end(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE | XACT_EVENT_PARALLEL_ABORT
    ) {
        crate::directory::statement::clear();
        crate::shard::bypass::clear();
    }
}

pub fn init() {
    unsafe { pg_sys::RegisterXactCallback(Some(on_xact_end), std::ptr::null_mut()) };
}
