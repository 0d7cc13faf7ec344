//! The directory's epoch: which history its versions belong to. A failover to a standby that
//! missed the last commits, or a restore, goes on from an older version and numbers again, with
//! other contents, versions that clients already knew; versions alone cannot tell the two
//! histories apart. The system identifier (another cluster: initdb, pg_upgrade) and the timeline
//! (a promotion, an archive recovery or point-in-time restore each begin a new one) can.

use pgrx::prelude::*;

/// `<system identifier>.<timeline>`: a new value after a promotion or a restore that recovered
/// (anyone may read it, as the version: clients read it with every version they read).
#[pg_extern(stable, parallel_safe)]
fn directory_epoch() -> String {
    // SAFETY: both read shared memory the server set up at start; neither raises an error.
    let (system, timeline) = unsafe {
        let timeline = if pg_sys::RecoveryInProgress() {
            let mut replaying = 0;
            pg_sys::GetXLogReplayRecPtr(&mut replaying);
            replaying
        } else {
            pg_sys::GetWALInsertionTimeLine()
        };
        (pg_sys::GetSystemIdentifier(), timeline)
    };
    format!("{system}.{timeline}")
}
