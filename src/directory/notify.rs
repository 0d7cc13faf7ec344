//! Notifications, queued with PostgreSQL's own `NOTIFY` and delivered when the transaction
//! commits: each new version on `CHANNEL`, each move's new phase on `MOVES_CHANNEL`.

use pgrx::prelude::*;
use shard_directory_protocol::Name;

unsafe extern "C-unwind" {
    /// PostgreSQL's own `NOTIFY` (what `pg_notify()` calls); pgrx has no binding for it.
    fn Async_Notify(channel: *const std::ffi::c_char, payload: *const std::ffi::c_char);
}

/// Queues `payload` on `channel`. Called directly, not through SQL, which would cost an executor
/// run per changing statement.
pub fn send(channel: Name, payload: &str) {
    let payload = std::ffi::CString::new(payload).expect("payloads are text without NUL");
    // SAFETY: both strings live across the call; an ERROR (a payload over 8000 bytes) is turned
    // into a Rust panic by the guard, which pgrx raises as that ERROR.
    unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            Async_Notify(channel.as_c_str().as_ptr(), payload.as_ptr())
        })
    }
}

/// A move's new phase, as `MOVES_CHANNEL` carries it.
pub fn move_phase(
    move_id: i64,
    entity: (&str, &str),
    (source_shard, target_shard): (&str, &str),
    phase: &str,
) {
    let payload = serde_json::json!({
        "move_id": move_id,
        "entity_type": entity.0,
        "entity_id": entity.1,
        "source_shard": source_shard,
        "target_shard": target_shard,
        "phase": phase,
    });
    send(
        shard_directory_protocol::MOVES_CHANNEL,
        &payload.to_string(),
    );
}
