//! Every error the extension raises, in one place: a message that names the entity and the
//! states or versions involved (`SdError`), and what goes with it when it is raised:
//! - `sqlstate`: its stable SQLSTATE, one table for all;
//! - `detail`: the DETAIL (a refusal's JSON, the protocol's) and what `stats()` counts it as;
//! - `hint`: the HINT, where the user has a next step;
//! - `cause`: how an SPI call or a column read that failed becomes one.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgLogLevel;
use shard_directory_protocol::EntityKey;

use crate::directory::placement::Placement;

mod cause;
mod detail;
mod hint;
mod sqlstate;

pub use cause::{required, spi};
pub use detail::Rejection;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdError {
    /// A change of `state` / `shard_name` / `target_shard` that the move state machine forbids.
    #[error("invalid directory transition for {entity}: {from} -> {to}{}", requested_by(*.step))]
    InvalidTransition {
        entity: EntityKey,
        from: Placement,
        to: Placement,
        /// The SQL function that asked for the step, when it was not a bare UPDATE.
        step: Option<&'static str>,
    },
    /// A new entry must start `active` with no target.
    #[error("new directory entry {entity} must be active with no target, not {to}")]
    InvalidInsert { entity: EntityKey, to: Placement },
    /// Deleting an entry in the middle of a move would strand the move.
    #[error("cannot delete directory entry {entity} while it is {from}")]
    DeleteDuringMove { entity: EntityKey, from: Placement },
    /// `entity_type` / `entity_id` are the entry's identity; history is keyed on them.
    #[error("cannot change a directory entry's key ({from} -> {to})")]
    KeyChange { from: EntityKey, to: EntityKey },
    /// A `state` value outside active / migrating / read_only.
    #[error("invalid state \"{state}\" for directory entry {entity}")]
    UnknownState { entity: EntityKey, state: String },
    /// `shard_name` or `target_shard` is not registered in `shard_directory.shards`.
    #[error("directory entry {entity} names unknown shard \"{shard}\"")]
    UnknownShard { entity: EntityKey, shard: String },
    /// A shard removed from the registry (or renamed) while an entry or an open move names it.
    #[error("shard \"{shard}\" cannot leave the registry: {user} names it")]
    ShardInUse { shard: String, user: String },
    /// The entry's region and its shard's region differ.
    #[error("directory entry {entity} is in region \"{entity_region}\" but shard \"{shard}\" is in region \"{shard_region}\"")]
    RegionMismatch {
        entity: EntityKey,
        entity_region: String,
        shard: String,
        shard_region: String,
    },
    /// A move function named an entity that has no directory entry.
    #[error("{step}: no directory entry for {entity}")]
    UnknownEntity {
        entity: EntityKey,
        step: &'static str,
    },
    /// A required argument or column was NULL.
    #[error("{what} must not be NULL")]
    NullValue { what: &'static str },
    /// History is append-only.
    #[error("shard_directory_history is append-only: {op} refused")]
    HistoryAppendOnly { op: &'static str },
    /// The directory or its history cannot be truncated: it would bypass versioning and history.
    #[error("TRUNCATE of {table} refused")]
    TruncateRefused { table: String },
    /// `shard_directory_version` only moves forward, one row.
    #[error("shard_directory_version may only increase (from {from} to {to} refused)")]
    VersionRegression { from: i64, to: i64 },
    #[error("shard_directory_version holds exactly one row: {op} refused")]
    VersionRowFixed { op: &'static str },
    /// One of the directory's triggers is dropped or disabled (a row trigger ran without its
    /// statement trigger, or a statement began whose row triggers would not run).
    #[error(
        "trigger {trigger} on shard_directory.shard_directory is dropped or disabled: \
                 the directory's triggers are incomplete, and a change would not be versioned"
    )]
    TriggersMissing { trigger: &'static str },
    /// A write of the directory's tables in a session with `session_replication_role = replica`.
    #[error(
        "shard_directory.{table} cannot be written with session_replication_role = replica: \
         the directory's rules, versions, history and notifications would not be made"
    )]
    ReplicaWrite { table: &'static str },
    /// A write of the directory's tables by a logical replication worker (a subscription).
    #[error(
        "shard_directory.{table} cannot be written by logical replication: a copy of the \
         directory would have no versions, history or notifications of its own"
    )]
    LogicalReplicaWrite { table: &'static str },
    /// A publication that would carry one of the directory's tables to a logical copy.
    #[error(
        "publication {publication} cannot carry shard_directory.{table}: a logical copy of the \
         directory would have no versions, history or notifications of its own"
    )]
    PublishedDirectory { publication: String, table: String },
    /// PREPARE TRANSACTION of a transaction that changed the directory: its versions are taken
    /// and notified at commit.
    #[error(
        "a transaction that changed shard_directory.shard_directory cannot be prepared: \
                 its versions are taken and notified when it commits"
    )]
    PrepareRefused,
    /// A singleton table of the extension lost its row.
    #[error("shard_directory.{table} has lost its row")]
    SingletonMissing { table: &'static str },
    /// A column of the extension's tables altered by hand to a type its raw reads and writes
    /// do not expect.
    #[error("column {column} of {table} is {found}, but the extension reads and writes it as {expected}")]
    ColumnType {
        table: String,
        column: String,
        expected: &'static str,
        found: String,
    },
    /// A trigger function of the extension was attached to a table that is not its own.
    #[error("trigger function shard_directory.{function}() refuses to run on {table}")]
    TriggerMisused {
        function: &'static str,
        table: String,
    },
    /// An SPI call or a column read inside the extension failed (a table altered by hand, a call
    /// from a context that cannot run SQL).
    #[error("shard_directory: {during} failed: {cause}")]
    Spi {
        during: &'static str,
        cause: String,
        datatype: bool,
    },

    // ---- shard side: the rejections a client retries (40001), then the rest ----
    /// `app.directory_version` is unset (`client: None`) or below `min_accepted`.
    #[error("stale shard directory (client {}, minimum {minimum})", or_null(*.client))]
    StaleDirectory { client: Option<i64>, minimum: i64 },
    /// The client's version is below the entity's fence minimum.
    #[error("stale shard directory for {entity} (client {}, minimum {minimum})", or_null(*.client))]
    StaleEntity {
        entity: EntityKey,
        client: Option<i64>,
        minimum: i64,
    },
    /// The entity is frozen on this shard while its cutover runs.
    #[error("{entity} is frozen on this shard while its cutover runs")]
    EntityFrozen { entity: EntityKey },
    /// The entity has left this shard for `moved_to` at directory version `version`.
    #[error("{entity} has moved to shard \"{moved_to}\" (directory version {version})")]
    EntityMoved {
        entity: EntityKey,
        moved_to: String,
        version: i64,
        client: Option<i64>,
    },
    /// An `app.*` setting holds a value that is not what it should be.
    #[error("invalid value for {name}: \"{value}\" is not {expected}")]
    InvalidSetting {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// Only one of `app.entity_type` / `app.entity_id` is set.
    #[error("{set} is set but {missing} is not")]
    PartialEntity {
        set: &'static str,
        missing: &'static str,
    },
    /// `raise_min_accepted` only raises; `min_accepted` is never lowered.
    #[error("raise_min_accepted({requested}) refused: min_accepted is already {current}")]
    MinAcceptedNotRaised { requested: i64, current: i64 },
    /// `shard_settings` holds exactly one row.
    #[error("shard_settings holds exactly one row: {op} refused")]
    SettingsRowFixed { op: &'static str },
    /// `protect` was given a key column the table does not have.
    #[error("column \"{column}\" of table {table} does not exist")]
    UnknownColumn { table: String, column: String },
    /// A protect trigger whose arguments or key column no longer fit its table.
    #[error("protect trigger {trigger}: {problem}")]
    ProtectionBroken { trigger: String, problem: String },
    /// One of the extension's own tables is missing in this database.
    #[error("shard_directory.{name} does not exist in this database")]
    ObjectMissing { name: String },
    /// A fence change or `raise_min_accepted` waited `waited_ms` for checked transactions in
    /// flight (`blockers`: their pids and states) and gave up.
    #[error("{what} gave up after waiting {waited_ms} ms for checked transactions in flight: {blockers}")]
    FenceWaitTimeout {
        what: String,
        waited_ms: i32,
        blockers: String,
    },
    /// TRUNCATE of a protected table would wipe the rows of an entity fenced frozen or moved.
    #[error("TRUNCATE of {table} refused: {entity} is fenced {fence} on this shard, and TRUNCATE would wipe its rows")]
    TruncateFenced {
        table: String,
        entity: EntityKey,
        fence: &'static str,
    },
    /// `protect` / `unprotect` need the TRIGGER privilege on the table.
    #[error("role \"{role}\" may not protect or unprotect {table}: it lacks the TRIGGER privilege on it")]
    ProtectNotAllowed { table: String, role: String },
    /// `protect` accepts tables and partitioned tables only.
    #[error("{table} is not a table: protect() accepts tables and partitioned tables")]
    NotATable { table: String },
    /// A key column whose type's equality is not the equality of one text per key (`key`).
    #[error("key column {column} has type {type_name}, which cannot key an entity: {why}")]
    UnsupportedKeyType {
        column: String,
        type_name: String,
        why: &'static str,
    },
    /// An entity id that its key column reads back differently (`08842` for a bigint key).
    #[error("entity id \"{}\" of {entity} is not canonical for key column {column} ({type_name}), \
         which reads it as \"{canonical}\"", .entity.entity_id)]
    NonCanonicalId {
        entity: EntityKey,
        column: String,
        type_name: String,
        canonical: String,
    },
    /// A function that needs a table's key column was given a table not protected with one.
    #[error("table {table} is not protected with a key column")]
    NotProtectedWithKey { table: String },
    /// A table under tables protected with different keys (inheriting from two): its rows are
    /// checked by one row trigger, for one entity type.
    #[error(
        "table {table} is under tables protected with different keys, {protections}: a table's \
         rows are checked for one entity type"
    )]
    DifferentKeys { table: String, protections: String },
    /// Entity ids are compared as UTF-8 text: other database encodings are refused.
    #[error("shard_directory needs a UTF8 database, not {encoding}: entity ids are compared as UTF-8 text")]
    DatabaseEncoding { encoding: String },
    /// `advance_sequence` was given a relation that is not a sequence.
    #[error("{name} is not a sequence")]
    NotASequence { name: String },
    /// `advance_sequence` needs UPDATE on the sequence, as `setval` does.
    #[error(
        "role \"{role}\" may not advance sequence {name}: it lacks the UPDATE privilege on it"
    )]
    SequenceNotAllowed { name: String, role: String },
}

/// ` (requested by <step>)` when a SQL function asked for the step.
fn requested_by(step: Option<&str>) -> String {
    step.map_or_else(String::new, |step| format!(" (requested by {step})"))
}

/// A client's version as the message of the guide's PL/pgSQL check shows it.
fn or_null(client: Option<i64>) -> String {
    client.map_or_else(|| "<NULL>".to_owned(), |c| c.to_string())
}

impl SdError {
    /// Raises the error in PostgreSQL; never returns.
    #[track_caller]
    pub fn raise(self) -> ! {
        let mut report = ErrorReport::new(self.sqlstate(), self.to_string(), "shard_directory");
        if let Some(detail) = self.detail() {
            report = report.set_detail(detail);
        }
        if let Some(hint) = self.hint() {
            report = report.set_hint(hint);
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("ereport(ERROR) returned")
    }
}
