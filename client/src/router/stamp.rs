//! The stamp: the settings a shard's check reads, set for the transaction only, and the check
//! itself, in one statement that opens every routed transaction.

use std::sync::LazyLock;
use std::time::Duration;

/// The client's version and entity for the shard's check (the protocol's settings), set for
/// this transaction only. `$4`, the milliseconds the attempt has left, bounds its statements and
/// any idle time in the transaction (a stricter `statement_timeout` of the session's stays).
fn settings() -> String {
    use shard_directory_protocol::setting::{DIRECTORY_VERSION, ENTITY_ID, ENTITY_TYPE};
    format!(
        "set_config('{DIRECTORY_VERSION}', $1, true), \
         set_config('{ENTITY_TYPE}', $2, true), set_config('{ENTITY_ID}', $3, true), \
         set_config('statement_timeout', CASE WHEN current_setting('statement_timeout') <> '0' \
             AND current_setting('statement_timeout')::interval <= ($4 || ' ms')::interval \
             THEN current_setting('statement_timeout') ELSE $4 END, true), \
         set_config('idle_in_transaction_session_timeout', $4, true)"
    )
}

/// The settings, and the check `check` run on them in the same statement (the subquery,
/// volatile, so not flattened, sets them first).
fn stamp_and(check: &str) -> String {
    format!("SELECT {check} FROM (SELECT {}) stamp", settings())
}

/// An unchecked read's stamp: the settings alone.
pub(crate) static STAMP: LazyLock<String> = LazyLock::new(|| format!("SELECT {}", settings()));

/// A write's stamp also runs the check, so a stale route is refused before the closure runs
/// (whatever error type the closure returns); the check's lock then holds every fence of the
/// shard back until this transaction ends.
pub(crate) static STAMP_AND_CHECK: LazyLock<String> =
    LazyLock::new(|| stamp_and("shard_directory.assert_directory_version()"));

/// A read's: the check for a reader, which a frozen entity passes (its source holds every row
/// until the cutover) and a moved or stale one does not.
pub(crate) static STAMP_AND_READ_CHECK: LazyLock<String> =
    LazyLock::new(|| stamp_and("shard_directory.assert_directory_version(true)"));

/// `$4` of the stamp: the milliseconds an attempt has left, at least 1 and at most what
/// `statement_timeout` takes (`INT_MAX` ms, 24.8 days: a longer attempt is not bounded there).
pub(crate) fn left_ms(left: Duration) -> String {
    left.as_millis().clamp(1, i32::MAX as u128).to_string()
}
