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
//! Folders, in the order of a move:
//! - `mover` (the [`Mover`]: start, resume, abort, inspect) with its `options`;
//! - `preflight/` (what `start` checks before changing anything: `coverage`, every table
//!   holding the entity's rows is protected; `integrity`, no foreign key crosses to another
//!   entity; `privileges`, what the mover's role holds);
//! - `directory/` (the shards' `registry`, the entity's `entry`, the move's `record` and
//!   `phase`) and `shards/` (one shard's `side`, the entity's tables in its `catalog`, its
//!   `fence`);
//! - `run/` (one process driving one move: the state machine), a folder or file per phase:
//!   `replication/` (method `logical`), `copy/` (method `copy`, and the target's `triggers` it
//!   does not fire), `checks/` (online, then under the freeze only what `tracking` saw change),
//!   `freeze`, `cutover/` (with the `sequences`), `cleanup/` (`purge`, paced by `throttle`),
//!   `abort`, the `way_back` of a reversible move, and `schema` (DDL during a move);
//! - many moves: `planning/` (`sizes`, the freeze `budget`, plans that `balance`: drain, split,
//!   rebalance) and `batch` (a plan run, several moves at once);
//! - around them: `status` (who drives a move, what its slot keeps), `reconcile` (rows on a
//!   shard the directory does not name), `report/` (the `observer`, `telemetry`, `progress`),
//!   `patience` (retries within a deadline), `failpoint`, `error`.
//!
//! The relay, which republishes the directory's changes to the fleet and moves nothing, lives in
//! its own crate (`shard-directory-relay`); the CLI runs it as `shard-directory relay`.

mod batch;
mod directory;
mod error;
mod failpoint;
mod mover;
mod options;
mod patience;
mod planning;
mod preflight;
mod reconcile;
mod report;
mod run;
mod shards;
mod status;

pub use batch::{BatchMove, BatchOptions, BatchRun, BatchState, BatchStatus, Outcome};
pub use directory::entry::{HistoryRow, Placement};
pub use directory::phase::Phase;
pub use directory::record::{Method, MoveRecord, TableProgress};
pub use directory::registry::{Endpoint, Overrides, ShardOverride};
pub use error::{Error, Failure, Left, Place, Step};
pub use mover::Mover;
pub use options::{MethodChoice, MoveChoices, MoveOptions};
pub use planning::balance::{
    drain, rebalance, split, BatchPlan, Fleet, Placed, PlannedMove, ShardInfo, Skipped, Totals,
};
pub use planning::sizes::{Size, TableSize, Weigh};
pub use preflight::Plan;
pub use reconcile::Stray;
pub use report::observer::{LogObserver, Observer};
pub use run::schema::SchemaChange;
pub use run::way_back::WayBack;
/// libpq's password lookup (`shard_directory_connect`), which the CLI applies to `--directory`.
pub use shard_directory_connect::with_password;
/// The protocol's key and state, as the mover's API takes and returns them.
pub use shard_directory_protocol::{EntityKey, State};
pub use shards::fence::Fence;
pub use status::slots::Slots;
pub use status::way_back::Unreadable;
pub use status::{Driver, MoveStatus, Slot};
