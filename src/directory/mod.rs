//! Directory role: the entity -> shard mapping, its version, notification, history and the move
//! state machine.
//!
//! - `triggers`: the native triggers on the directory's tables. Each is thin; the rules are in
//!   - `transition`: the move state machine, over an entry's `placement`;
//!   - `registry`: a shard stays registered while anything names it; regions match;
//!   - `replica`: writes in a replica's session are refused;
//!   - `version`: one version per changing statement, taken at commit, notified; `latest`
//!     keeps the newest version and where the version row is in shared memory;
//!   - `history`: one row per change (and `placement_at`, `purge_history`).
//! - `notify`: notifications (each version; each move's phase).
//! - `row`: an entry read out of a trigger's tuple.
//! - `heap`: the bookkeeping rows written and read without SQL; `columns`: the type each column
//!   is read and written raw as; `writer`: which of the extension's own writes is running.
//! - SQL functions: `moves` (the move steps, `current_version`, `release_expired_freeze`),
//!   `changes` (`changes_since`), `epoch` (`directory_epoch`).

mod changes;
mod columns;
mod epoch;
mod heap;
mod history;
pub(crate) mod latest;
pub(crate) mod moves;
mod notify;
pub(crate) mod placement;
mod registry;
pub(crate) mod replica;
mod row;
pub mod transition;
pub mod triggers;
pub(crate) mod version;
mod writer;

pub fn init() {
    latest::init();
}
