//! Every error the mover reports: which step failed, where (the directory, a shard, a table), and
//! what to do next where there is something to do.

use std::fmt;

use shard_directory_connect::describe;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::directory::phase::Phase;

/// A step of a move, as errors and logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Connect,
    /// Reading the fleet for a plan of many moves (`drain`, `split`, `rebalance`).
    Plan,
    Preflight,
    Begin,
    Replicate,
    Sync,
    CatchUp,
    Freeze,
    Copy,
    Verify,
    /// Following the entity's changes on both shards, for the check under the freeze.
    Track,
    Sequences,
    FenceTarget,
    Cutover,
    FenceSource,
    DropReplication,
    DeleteSource,
    /// `--reversible`: the replication of the entity's rows from the target back to the source.
    WayBack,
    Abort,
    Record,
    Cleanup,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Connect => "connect",
            Step::Plan => "plan",
            Step::Preflight => "preflight",
            Step::Begin => "begin",
            Step::Replicate => "replicate",
            Step::Sync => "initial copy",
            Step::CatchUp => "catch-up",
            Step::Freeze => "freeze",
            Step::Copy => "copy",
            Step::Verify => "verify",
            Step::Track => "change tracking",
            Step::Sequences => "sequences",
            Step::FenceTarget => "fence target",
            Step::Cutover => "cutover",
            Step::FenceSource => "fence source",
            Step::DropReplication => "drop replication",
            Step::DeleteSource => "delete source rows",
            Step::WayBack => "way back",
            Step::Abort => "abort",
            Step::Record => "move record",
            Step::Cleanup => "cleanup",
        })
    }
}

/// Where a database error happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Directory,
    Shard(String),
    Table { shard: String, table: String },
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Directory => f.write_str("directory"),
            Place::Shard(s) => write!(f, "shard {s}"),
            Place::Table { shard, table } => write!(f, "shard {shard}, table {table}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A database call failed.
    #[error("{step}: {place}: {}", describe(.source))]
    Db {
        step: Step,
        place: Place,
        #[source]
        source: tokio_postgres::Error,
    },
    /// The move cannot start (or go on) as asked; nothing was changed by this check.
    #[error("{problem}\n  fix: {fix}")]
    Preflight { problem: String, fix: String },
    /// The entity's rows differ between source and target while frozen.
    #[error(
        "verify: table {table} differs: source has {source_rows} rows, target {target_rows}{}; \
         differing keys (first 20): {}",
        if *.changed_only { " among the rows changed since the online check" } else { "" },
        .keys.join(", ")
    )]
    Mismatch {
        table: String,
        /// The rows compared on each side: all of the entity's in the table, or (`changed_only`)
        /// those of the keys changed since the online check.
        source_rows: i64,
        target_rows: i64,
        changed_only: bool,
        keys: Vec<String>,
    },
    /// A shard's stream of the entity's changes could not be read.
    #[error(
        "change tracking: slot {slot} on shard {shard} sent a message the mover cannot read \
         ({why}); the move stays resumable and checks online again when resumed"
    )]
    Stream {
        shard: String,
        slot: String,
        why: &'static str,
    },
    /// A foreign key joins a row of the entity to a row of another entity: one end would move
    /// and the other stay.
    #[error(
        "foreign key {constraint} of {from} joins rows of {entity} and of other entities \
         (rows of {from}, first 5: {}); a move would carry one end and leave the other\n  \
         fix: make the referencing rows belong to the entity they reference, or include the key \
         column in the foreign key", .rows.join(", ")
    )]
    CrossEntity {
        entity: shard_directory_protocol::EntityKey,
        constraint: String,
        from: String,
        rows: Vec<String>,
    },
    /// Rows of the entity on the target reference rows the target does not have.
    #[error(
        "verify: on shard {shard}, rows of {table} reference rows of {referenced} that are not \
         there (foreign key {constraint}; first 5: {})\n  fix: copy the referenced rows to shard \
         {shard} first (a table the entity does not own must hold the same rows on every shard)",
         .rows.join(", ")
    )]
    MissingReference {
        shard: String,
        table: String,
        constraint: String,
        referenced: String,
        rows: Vec<String>,
    },
    /// DDL on the entity's tables during the move (`run/schema.rs`): logical apply would stop, or the
    /// copies drift, so the move stops before its cutover, resumable.
    #[error(
        "{step}: the tables of {entity} changed during the move: {}; the move stops before its \
         cutover rather than carry rows its copy and its checks no longer describe\n  \
         fix: {}; then resume",
        .changes.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        .changes.iter().map(|c| c.fix.as_str()).collect::<Vec<_>>().join("; ")
    )]
    SchemaChanged {
        step: Step,
        entity: shard_directory_protocol::EntityKey,
        changes: Vec<crate::run::schema::SchemaChange>,
    },
    /// A drain of a shard that a reversible move's way back joins to another (`run/way_back.rs`).
    #[error(
        "drain: shard {shard} is joined to another shard by the way back of {}: drained and then \
         decommissioned, it would leave the way back's slot keeping WAL without bound, and the \
         move could be neither reverted nor finalized; nothing was planned or recorded\n  \
         fix: {}; then drain {shard}",
        .moves.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        .moves.iter().map(crate::run::way_back::WayBack::fix).collect::<Vec<_>>().join("; ")
    )]
    WayBackJoins {
        shard: String,
        moves: Vec<crate::run::way_back::WayBack>,
    },
    /// Catch-up and verification did not finish within `--max-freeze`.
    #[error("{step}: the freeze exceeded --max-freeze ({})", humantime::format_duration(*.limit))]
    FreezeExceeded { step: Step, limit: Duration },
    /// Waiting for something that did not happen in time (outside the freeze).
    #[error("{step}: timed out after {} waiting for {what}", humantime::format_duration(*.after))]
    Timeout {
        step: Step,
        what: String,
        after: Duration,
    },
    /// The target's subscription stopped after an error (`disable_on_error`).
    #[error(
        "{step}: subscription {name} on shard {shard} was disabled after {errors} error(s); \
         its server log says why"
    )]
    SubscriptionFailed {
        step: Step,
        name: String,
        shard: String,
        errors: i64,
    },
    /// PostgreSQL lost a table's tablesync slot (`mover/src/run/replication/tablesync.rs`) each time the mover copied
    /// again.
    #[error(
        "{step}: the initial copy of {table} on shard {to} lost its tablesync slot on shard \
         {from} {attempts} time(s) (the target stopped as PostgreSQL finished the table's copy)\n  \
         fix: `resume` copies every table again; `abort` gives the move up"
    )]
    TablesyncLost {
        step: Step,
        table: String,
        from: String,
        to: String,
        attempts: u32,
    },
    /// The move is in a state that does not allow what was asked.
    #[error("move {move_id} ({phase}): {why}")]
    State {
        move_id: i64,
        phase: Phase,
        why: String,
    },
    /// Another process holds the move.
    #[error(
        "move {move_id} is being run by another process: {holder} holds the move's lock \
         (a process that vanished lets go of it within about a minute)"
    )]
    Busy { move_id: i64, holder: String },
    #[error(
        "batch {batch_id} is being run by another process: {holder} holds the batch's lock \
         (`batch pause {batch_id}` or `batch abort {batch_id}` reach it from here)"
    )]
    BatchBusy { batch_id: i64, holder: String },
    /// The directory did not answer a batch's command within its patience; a runner stops so
    /// only once the moves it ran have stopped (each waits out the directory itself).
    #[error(
        "batch {batch_id}: the directory did not answer within --directory-patience ({}): \
         {cause}; the batch is left as it was (a runner starts no more moves and stops once \
         those under way have stopped)\n  fix: once the directory answers, `shard-directory \
         batch status {batch_id}` shows where each move stands and `shard-directory batch \
         resume {batch_id}` goes on",
        humantime::format_duration(*.patience)
    )]
    BatchStopped {
        batch_id: i64,
        patience: Duration,
        cause: Box<Error>,
    },
    #[error("no batch {0} in shard_directory.shard_move_batches")]
    UnknownBatch(i64),
    /// The freeze's lease ran out before the cutover: the entity may already have been
    /// released, so the cutover is not made.
    #[error(
        "cutover: the freeze's lease (--max-freeze plus --lease-grace) ended before the \
         cutover; the move is undone rather than cut over late"
    )]
    LeaseExpired,
    /// Waiting behind other transactions for something that needs them to end.
    #[error(
        "{step}: shard {shard}: {what} waited {} for transactions in progress: {blockers}\n  \
         fix: let them finish, or end them (pg_terminate_backend(pid)), and resume",
        humantime::format_duration(*.waited)
    )]
    Blocked {
        step: Step,
        shard: String,
        what: String,
        waited: Duration,
        blockers: String,
    },
    /// The move's replication slot keeps more WAL on the source than allowed.
    #[error(
        "{step}: slot {name} on shard {shard} retains {retained} bytes of WAL, more than \
         --max-slot-lag ({limit} bytes): the move is undone before the source's disk fills \
         (see also max_slot_wal_keep_size)"
    )]
    SlotLag {
        step: Step,
        name: String,
        shard: String,
        retained: i64,
        limit: i64,
    },
    /// The directory entry is in a state this mover does not know.
    #[error(
        "the directory entry {entity} is in state \"{state}\", which this mover does not know\n  \
         fix: use a mover of the directory's extension version"
    )]
    UnknownState {
        entity: shard_directory_protocol::EntityKey,
        state: String,
    },
    /// A shard the step needs could not be reached.
    #[error("{step}: shard {shard} is unreachable: {cause}")]
    Unreachable {
        step: Step,
        shard: String,
        cause: String,
    },
    #[error("no move with id {0} in shard_directory.shard_moves")]
    UnknownMove(i64),
    /// A failpoint's injected error (the cargo feature `failpoints`, for the sweep).
    #[cfg(feature = "failpoints")]
    #[error("failpoint {point}: injected error")]
    Injected { point: String },
    /// Bad configuration: a connection string, the TOML file.
    #[error("configuration: {0}")]
    Config(String),
}

/// Attaches the step and place to a database error.
pub(crate) trait At<T> {
    fn at(self, step: Step, place: impl Into<Place>) -> Result<T, Error>;
}

impl<T> At<T> for Result<T, tokio_postgres::Error> {
    fn at(self, step: Step, place: impl Into<Place>) -> Result<T, Error> {
        self.map_err(|source| Error::Db {
            step,
            place: place.into(),
            source,
        })
    }
}

impl From<&str> for Place {
    fn from(shard: &str) -> Place {
        Place::Shard(shard.to_owned())
    }
}

/// How a move that failed was left: what the operator does next depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// Nothing was started (preflight refused, or the record could not be written).
    Untouched,
    /// The move was aborted: the entity is active and writable on its source.
    Aborted,
    /// The entity is active and writable on its source again, but cleaning the target did not
    /// finish: `abort` finishes it.
    Released,
    /// The move stopped where it was; `resume` continues it (and `abort` undoes it, before the
    /// cutover).
    Resumable,
}

/// A move that did not finish.
#[derive(Debug)]
pub struct Failure {
    pub move_id: Option<i64>,
    pub error: Error,
    pub left: Left,
    /// Where the move's record stands, as far as the mover could read it.
    pub phase: Option<Phase>,
    /// When an automatic abort was tried and failed too.
    pub abort_error: Option<Error>,
}

impl Error {
    /// Whether a connection was lost: closed or refused, the server shutting down, restarting or
    /// not yet accepting, the session ended; or, for the directory, a standby reached instead of
    /// the primary. A shard that could not be reached at all counts too.
    pub(crate) fn lost_connection(&self) -> bool {
        let (place, source) = match self {
            Error::Db { place, source, .. } => (place, source),
            Error::Unreachable { .. } => return true,
            _ => return false,
        };
        source.is_closed()
            || source.code().is_none_or(|code| {
                [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                ]
                .contains(code)
                    || (*place == Place::Directory && *code == SqlState::READ_ONLY_SQL_TRANSACTION)
            })
    }

    /// Whether the directory stopped answering ([`Error::lost_connection`] there).
    pub(crate) fn lost_directory(&self) -> bool {
        matches!(
            self,
            Error::Db {
                place: Place::Directory,
                ..
            }
        ) && self.lost_connection()
    }
}

impl Failure {
    /// Whether the move stopped, resumable, because its directory stopped answering.
    pub(crate) fn lost_directory(&self) -> bool {
        self.left == Left::Resumable && self.move_id.is_some() && self.error.lost_directory()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        match (self.left, self.move_id) {
            (Left::Aborted, Some(id)) => write!(
                f,
                "\nmove {id} was aborted: the entity is active and writable on its source shard"
            )?,
            (Left::Released, Some(id)) => write!(
                f,
                "\nmove {id}: the entity is active and writable on its source shard again, but \
                 its target is not cleaned up yet: `shard-directory abort {id}` finishes that"
            )?,
            (Left::Resumable, Some(id)) if self.phase.is_none_or(Phase::can_abort) => write!(
                f,
                "\nmove {id} is left resumable: `shard-directory resume {id}` continues it, \
                 `shard-directory abort {id}` undoes it"
            )?,
            (Left::Resumable, Some(id)) => write!(
                f,
                "\nmove {id} is past its cutover and left resumable: `shard-directory resume \
                 {id}` finishes it"
            )?,
            _ => write!(f, "\nnothing was changed")?,
        }
        if let Some(e) = &self.abort_error {
            write!(f, "\nthe automatic abort failed too: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

impl Failure {
    pub(crate) fn untouched(error: Error) -> Failure {
        Failure {
            move_id: None,
            error,
            left: Left::Untouched,
            phase: None,
            abort_error: None,
        }
    }
}
