//! Writes of the directory in a replica's session are refused: with `session_replication_role
//! = replica` (a logical replication worker's, or a superuser's session) the directory's ordinary
//! triggers would not run, and they make its rules, versions, history and notifications.

use pgrx::prelude::*;

use crate::error::SdError;

/// Refuses a write of `table` (one of the directory's) in a replica's session, saying whether it
/// is a logical replication worker's (a subscription copying the directory). The row guards
/// that call this fire in that role too (ENABLE ALWAYS).
pub fn refuse_replica_role(table: &'static str) {
    // SAFETY: reads a setting of the backend's.
    let replica = unsafe { pg_sys::SessionReplicationRole }
        == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32;
    if !replica {
        return;
    }
    // SAFETY: reads the backend's worker state.
    if unsafe { pg_sys::IsLogicalWorker() } {
        SdError::LogicalReplicaWrite { table }.raise()
    }
    SdError::ReplicaWrite { table }.raise()
}
