//! `shard-directory-mover`: moves one entity between shards while the application keeps running,
//! and ends with the directory, the fences and the rows agreeing.
//!
//! The entity's tables are the ones its shards `protect(table, key_column, entity_type)`. Two
//! methods carry its rows: `logical` (a row-filtered publication on the source and a subscription
//! on the target: copy, then stream; writes are refused only for the final catch-up) and `copy`
//! (the rows are copied while the entity is frozen). Every move is a row of
//! `shard_directory.shard_moves`; every step is idempotent and reads the real state, so a move
//! that stopped anywhere continues with [`Mover::resume`] or returns to its start with
//! [`Mover::abort`], up to `complete_move`, its point of no return.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use shard_directory_mover::{EntityKey, MoveOptions, Mover, Overrides};
//!
//! let mover = Mover::new(
//!     "host=dir.internal dbname=directory user=mover".parse()?,
//!     Overrides::default(),
//!     MoveOptions::default(),
//! );
//! let done = mover.start(&EntityKey::new("tenant", "8842"), "shard_2").await?;
//! println!("moved at version {:?}, frozen for {:?}", done.cutover_version, done.freeze_time());
//! # Ok(()) }
//! ```
//!
//! Modules, in the order of a move:
//! - `mover` (the [`Mover`]: start, resume, abort, inspect) with its `options`;
//! - `preflight` (what `start` checks before changing anything), drawing on `catalog` (the
//!   entity's tables), `coverage` (every table holding its rows is protected), `integrity` (no
//!   foreign key crosses to another entity), `privileges` (what the mover's role holds) and
//!   `registry` (where the shards are);
//! - `run` (one process driving one move, phase by phase): `record` (`shard_moves`), `phase`,
//!   `entry` (the directory entry), `side` (one shard), `fence`, `logical` and `copy` (the two
//!   methods; `triggers`: the target's own, which the copy does not fire), `verify` (online,
//!   then under the freeze only what `tracking` saw change, read from `pgoutput` streams),
//!   `schema` (DDL on the entity's tables during the move), `sequences`, `purge` (the source's
//!   rows deleted, paced by `throttle`);
//! - many moves: `sizes` (each entity's rows, bytes and load on its shard), `budget` (the
//!   freeze a move of each would take), `balance` (plans that drain, split or rebalance shards,
//!   keeping every move within `--max-freeze`) and `batch` (a plan run, several moves at once);
//! - `way_back` (a reversible move's way back: what it keeps a drain from, and a finalize
//!   without its source);
//! - `status` (who drives a move, what its slot keeps), `reconcile` (rows on a shard the
//!   directory does not name), `observer` (what a move reports) and `telemetry` (the same, as
//!   metrics), `error`.

mod balance;
mod batch;
mod budget;
mod catalog;
mod copy;
mod coverage;
mod entry;
mod error;
mod failpoint;
mod fence;
mod initial_copy;
mod integrity;
mod logical;
mod mover;
mod observer;
mod options;
mod patience;
mod pgoutput;
mod phase;
mod preflight;
mod privileges;
mod progress;
mod purge;
mod reconcile;
mod record;
mod registry;
mod relay;
mod run;
mod schema;
mod sequences;
mod side;
mod sizes;
mod status;
mod tablesync;
mod telemetry;
mod throttle;
mod tracking;
mod triggers;
mod verify;
mod way_back;

pub use balance::{
    drain, rebalance, split, BatchPlan, Fleet, Placed, PlannedMove, ShardInfo, Skipped, Totals,
};
pub use batch::{BatchMove, BatchOptions, BatchRun, BatchState, BatchStatus, Outcome};
pub use entry::{HistoryRow, Placement};
pub use error::{Error, Failure, Left, Place, Step};
pub use fence::Fence;
pub use mover::Mover;
pub use observer::{LogObserver, Observer};
pub use options::{MethodChoice, MoveChoices, MoveOptions};
pub use phase::Phase;
pub use preflight::Plan;
pub use reconcile::Stray;
pub use record::{Method, MoveRecord, TableProgress};
pub use registry::{with_password, Endpoint, Overrides, ShardOverride};
pub use relay::{relay, RelayOptions, RELAY_APPLICATION_NAME};
pub use schema::SchemaChange;
/// The protocol's key and state, as the mover's API takes and returns them.
pub use shard_directory_protocol::{EntityKey, State};
pub use sizes::{Size, Weigh};
pub use status::{Driver, MoveStatus, Slot};
pub use way_back::WayBack;
