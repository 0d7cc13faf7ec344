//! Every error the extension raises, in one place: a stable SQLSTATE, a message that names the
//! entity and the states or versions involved, and a HINT where the user has a next step.

use std::fmt;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use shard_directory_protocol::refusal::Reason;

use crate::directory::transition::Placement;
use crate::entity::EntityKey;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SdError {
    /// A change of `state` / `shard_name` / `target_shard` that the move state machine forbids.
    InvalidTransition {
        entity: EntityKey,
        from: Placement,
        to: Placement,
        /// The SQL function that asked for the step, when it was not a bare UPDATE.
        step: Option<&'static str>,
    },
    /// A new entry must start `active` with no target.
    InvalidInsert {
        entity: EntityKey,
        to: Placement,
    },
    /// Deleting an entry in the middle of a move would strand the move.
    DeleteDuringMove {
        entity: EntityKey,
        from: Placement,
    },
    /// `entity_type` / `entity_id` are the entry's identity; history is keyed on them.
    KeyChange {
        from: EntityKey,
        to: EntityKey,
    },
    /// A `state` value outside active / migrating / read_only.
    UnknownState {
        entity: EntityKey,
        state: String,
    },
    /// `shard_name` or `target_shard` is not registered in `shard_directory.shards`.
    UnknownShard {
        entity: EntityKey,
        shard: String,
    },
    /// A shard removed from the registry (or renamed) while an entry or an open move names it.
    ShardInUse {
        shard: String,
        user: String,
    },
    /// The entry's region and its shard's region differ.
    RegionMismatch {
        entity: EntityKey,
        entity_region: String,
        shard: String,
        shard_region: String,
    },
    /// A move function named an entity that has no directory entry.
    UnknownEntity {
        entity: EntityKey,
        step: &'static str,
    },
    /// A required argument or column was NULL.
    NullValue {
        what: &'static str,
    },
    /// History is append-only.
    HistoryAppendOnly {
        op: &'static str,
    },
    /// The directory or its history cannot be truncated: it would bypass versioning and history.
    TruncateRefused {
        table: String,
    },
    /// `shard_directory_version` only moves forward, one row.
    VersionRegression {
        from: i64,
        to: i64,
    },
    VersionRowFixed {
        op: &'static str,
    },
    /// One of the directory's triggers is dropped or disabled (a row trigger ran without its
    /// statement trigger, or a statement began whose row triggers would not run).
    TriggersMissing {
        trigger: &'static str,
    },
    /// A write of the directory's tables with `session_replication_role = replica`: by a
    /// logical replication worker (`logical`), or a session set so.
    ReplicaWrite {
        table: &'static str,
        logical: bool,
    },
    /// PREPARE TRANSACTION of a transaction that changed the directory: its versions are taken
    /// and notified at commit.
    PrepareRefused,
    /// A singleton table of the extension lost its row.
    SingletonMissing {
        table: &'static str,
    },
    /// A column of the extension's tables altered by hand to a type its raw reads and writes
    /// do not expect.
    ColumnType {
        table: String,
        column: String,
        expected: &'static str,
        found: String,
    },
    /// A trigger function of the extension was attached to a table that is not its own.
    TriggerMisused {
        function: &'static str,
        table: String,
    },
    /// An SPI call or a column read inside the extension failed (a table altered by hand, a call
    /// from a context that cannot run SQL).
    Spi {
        during: &'static str,
        cause: String,
        datatype: bool,
    },

    // ---- shard side: the rejections a client retries (40001), then the rest ----
    /// `app.directory_version` is unset (`client: None`) or below `min_accepted`.
    StaleDirectory {
        client: Option<i64>,
        minimum: i64,
    },
    /// The client's version is below the entity's fence minimum.
    StaleEntity {
        entity: EntityKey,
        client: Option<i64>,
        minimum: i64,
    },
    /// The entity is frozen on this shard while its cutover runs.
    EntityFrozen {
        entity: EntityKey,
    },
    /// The entity has left this shard for `moved_to` at directory version `version`.
    EntityMoved {
        entity: EntityKey,
        moved_to: String,
        version: i64,
        client: Option<i64>,
    },
    /// An `app.*` setting holds a value that is not what it should be.
    InvalidSetting {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// Only one of `app.entity_type` / `app.entity_id` is set.
    PartialEntity {
        set: &'static str,
        missing: &'static str,
    },
    /// `raise_min_accepted` only raises; `min_accepted` is never lowered.
    MinAcceptedNotRaised {
        requested: i64,
        current: i64,
    },
    /// `shard_settings` holds exactly one row.
    SettingsRowFixed {
        op: &'static str,
    },
    /// `protect` was given a key column the table does not have.
    UnknownColumn {
        table: String,
        column: String,
    },
    /// A protect trigger whose arguments or key column no longer fit its table.
    ProtectionBroken {
        trigger: String,
        problem: String,
    },
    /// One of the extension's own tables is missing in this database.
    ObjectMissing {
        name: String,
    },
    /// A fence change or `raise_min_accepted` waited `waited_ms` for checked transactions in
    /// flight (`blockers`: their pids and states) and gave up.
    FenceWaitTimeout {
        what: String,
        waited_ms: i32,
        blockers: String,
    },
    /// TRUNCATE of a protected table would wipe the rows of an entity fenced frozen or moved.
    TruncateFenced {
        table: String,
        entity: EntityKey,
        fence: &'static str,
    },
    /// `protect` / `unprotect` need the TRIGGER privilege on the table.
    ProtectNotAllowed {
        table: String,
        role: String,
    },
    /// `protect` accepts tables and partitioned tables only.
    NotATable {
        table: String,
    },
    /// A key column whose type's equality is not the equality of one text per key (`key`).
    UnsupportedKeyType {
        column: String,
        type_name: String,
        why: &'static str,
    },
    /// An entity id that its key column reads back differently (`08842` for a bigint key).
    NonCanonicalId {
        entity: EntityKey,
        column: String,
        type_name: String,
        canonical: String,
    },
    /// A function that needs a table's key column was given a table not protected with one.
    NotProtectedWithKey {
        table: String,
    },
    /// Entity ids are compared as UTF-8 text: other database encodings are refused.
    DatabaseEncoding {
        encoding: String,
    },
    /// `advance_sequence` was given a relation that is not a sequence.
    NotASequence {
        name: String,
    },
    /// `advance_sequence` needs UPDATE on the sequence, as `setval` does.
    SequenceNotAllowed {
        name: String,
        role: String,
    },
}

/// What an SPI call or a column read can fail with: a value of another type than the one read
/// (42804), or anything else (55000), told by the error's kind, never by its text.
pub trait Cause: fmt::Display {
    fn is_datatype(&self) -> bool;
}

impl Cause for pgrx::spi::SpiError {
    fn is_datatype(&self) -> bool {
        matches!(self, pgrx::spi::SpiError::DatumError(_))
    }
}

impl Cause for pgrx::datum::TryFromDatumError {
    fn is_datatype(&self) -> bool {
        true
    }
}

/// Not about a value's type: a problem the extension describes itself (a column missing), a
/// time out of range, a trigger called as something else, a number that does not parse.
macro_rules! other_causes {
    ($($t:ty),*) => {
        $(impl Cause for $t {
            fn is_datatype(&self) -> bool {
                false
            }
        })*
    };
}
other_causes!(
    String,
    pgrx::datetime::FromTimeError,
    pgrx::PgTriggerError,
    std::num::ParseIntError
);

/// The value of an SPI call or column read, or an error naming the step: never a Rust panic,
/// which PostgreSQL would report as XX000 with Rust's text.
pub fn spi<T, E: Cause>(during: &'static str, result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| {
        SdError::Spi {
            during,
            datatype: e.is_datatype(),
            cause: e.to_string(),
        }
        .raise()
    })
}

/// The argument, or a 22004 naming it: SQL functions take `Option`s so that a NULL gets a clear
/// error instead of a silent NULL result (what STRICT would give).
pub fn required<T>(value: Option<T>, what: &'static str) -> T {
    value.unwrap_or_else(|| SdError::NullValue { what }.raise())
}

/// What `stats()` counts a refused request as: a refusal's reason (the protocol's, as the
/// client reads it in the DETAIL), or a client's bad setting (22023).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    Refused(Reason),
    Invalid,
}

impl Rejection {
    pub const ALL: [Rejection; 5] = [
        Rejection::Refused(Reason::Stale),
        Rejection::Refused(Reason::Missing),
        Rejection::Refused(Reason::Frozen),
        Rejection::Refused(Reason::Moved),
        Rejection::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Refused(reason) => reason.as_str(),
            Rejection::Invalid => "invalid",
        }
    }
}

fn allowed_steps(from: &Placement) -> &'static str {
    use crate::directory::transition::State::*;
    match (from.state, from.target_shard.is_some()) {
        (Active, _) => {
            "from active: begin_move(entity_type, entity_id, target_shard) -> migrating, \
             or freeze(entity_type, entity_id) -> read_only (maintenance)"
        }
        (Migrating, _) => {
            "from migrating: freeze(entity_type, entity_id) -> read_only, \
             or abort_move(entity_type, entity_id) -> active at the source"
        }
        (ReadOnly, true) => {
            "from read_only: complete_move(entity_type, entity_id) -> active at the target, \
             or abort_move(entity_type, entity_id) -> active at the source"
        }
        (ReadOnly, false) => {
            "from read_only (maintenance): abort_move(entity_type, entity_id) -> active"
        }
    }
}

const REPOINT_HINT: &str =
    "In an emergency, SET LOCAL shard_directory.allow_repoint = on permits a direct re-point; history records it.";

impl SdError {
    pub fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            Self::InvalidTransition { .. }
            | Self::InvalidInsert { .. }
            | Self::DeleteDuringMove { .. }
            | Self::KeyChange { .. }
            | Self::HistoryAppendOnly { .. }
            | Self::TruncateRefused { .. }
            | Self::VersionRegression { .. }
            | Self::VersionRowFixed { .. }
            | Self::TriggersMissing { .. }
            | Self::SingletonMissing { .. }
            | Self::Spi {
                datatype: false, ..
            } => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            Self::Spi { datatype: true, .. } | Self::ColumnType { .. } => ERRCODE_DATATYPE_MISMATCH,
            Self::TriggerMisused { .. } => ERRCODE_TRIGGERED_ACTION_EXCEPTION,
            Self::FenceWaitTimeout { .. } => ERRCODE_LOCK_NOT_AVAILABLE,
            Self::TruncateFenced { .. } => ERRCODE_T_R_SERIALIZATION_FAILURE,
            Self::ProtectNotAllowed { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
            Self::NotATable { .. } | Self::NotASequence { .. } => ERRCODE_WRONG_OBJECT_TYPE,
            Self::SequenceNotAllowed { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
            Self::UnsupportedKeyType { .. }
            | Self::DatabaseEncoding { .. }
            | Self::PrepareRefused
            | Self::ReplicaWrite { .. } => ERRCODE_FEATURE_NOT_SUPPORTED,
            Self::NonCanonicalId { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            Self::NotProtectedWithKey { .. } => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            Self::UnknownState { .. } | Self::RegionMismatch { .. } => ERRCODE_CHECK_VIOLATION,
            Self::StaleDirectory { .. }
            | Self::StaleEntity { .. }
            | Self::EntityFrozen { .. }
            | Self::EntityMoved { .. } => ERRCODE_T_R_SERIALIZATION_FAILURE,
            Self::InvalidSetting { .. }
            | Self::PartialEntity { .. }
            | Self::MinAcceptedNotRaised { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            Self::SettingsRowFixed { .. } => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            Self::UnknownColumn { .. } => ERRCODE_UNDEFINED_COLUMN,
            Self::ProtectionBroken { .. } | Self::ObjectMissing { .. } => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            Self::UnknownShard { .. } | Self::ShardInUse { .. } => ERRCODE_FOREIGN_KEY_VIOLATION,
            Self::UnknownEntity { .. } => ERRCODE_NO_DATA_FOUND,
            Self::NullValue { .. } => ERRCODE_NULL_VALUE_NOT_ALLOWED,
        }
    }

    /// The rejection a shard-side check counts this error as, if it is one.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            Self::StaleDirectory { client: None, .. } => Some(Rejection::Refused(Reason::Missing)),
            Self::StaleDirectory { .. } | Self::StaleEntity { .. } => {
                Some(Rejection::Refused(Reason::Stale))
            }
            Self::EntityFrozen { .. } => Some(Rejection::Refused(Reason::Frozen)),
            Self::EntityMoved { .. } => Some(Rejection::Refused(Reason::Moved)),
            Self::InvalidSetting { .. } | Self::PartialEntity { .. } => Some(Rejection::Invalid),
            _ => None,
        }
    }

    pub fn detail(&self) -> Option<String> {
        use shard_directory_protocol::refusal::Detail;
        let of = |entity: &EntityKey, reason| Detail {
            entity_type: Some(entity.entity_type.clone()),
            entity_id: Some(entity.entity_id.clone()),
            ..Detail::new(reason)
        };
        // The DETAIL of a refusal is one JSON object, for clients to parse (the protocol's).
        let refusal = match self {
            Self::StaleDirectory { client, minimum } => Some(Detail {
                client_version: Some(*client),
                min_accepted: Some(*minimum),
                ..Detail::new(if client.is_some() {
                    Reason::Stale
                } else {
                    Reason::Missing
                })
            }),
            Self::StaleEntity {
                entity,
                client,
                minimum,
            } => Some(Detail {
                client_version: Some(*client),
                min_version: Some(*minimum),
                ..of(entity, Reason::Stale)
            }),
            Self::EntityFrozen { entity } => Some(of(entity, Reason::Frozen)),
            Self::EntityMoved {
                entity,
                moved_to,
                version,
                client,
            } => Some(Detail {
                client_version: Some(*client),
                moved_to: Some(moved_to.clone()),
                version: Some(*version),
                ..of(entity, Reason::Moved)
            }),
            Self::TruncateFenced { entity, fence, .. } => Some(Detail {
                fence: Some((*fence).to_owned()),
                ..of(entity, Reason::TruncateFenced)
            }),
            _ => None,
        };
        if let Some(detail) = refusal {
            return Some(serde_json::to_string(&detail).expect("a refusal serializes"));
        }
        match self {
            Self::InvalidTransition { from, to, .. } => Some(format!(
                "The move state machine has no step from {} to {} with this shard and target.",
                from.state, to.state
            )),
            Self::RegionMismatch { .. } => {
                Some("Where both the entry and its shard have a region, they must match.".into())
            }
            _ => None,
        }
    }

    pub fn hint(&self) -> Option<String> {
        match self {
            Self::InvalidTransition { from, .. } => {
                Some(format!("Allowed steps {}. {REPOINT_HINT}", allowed_steps(from)))
            }
            Self::InvalidInsert { .. } => Some(
                "Insert the entry as active with target_shard NULL, then use begin_move.".into(),
            ),
            Self::DeleteDuringMove { .. } => {
                Some("Finish the move with complete_move or undo it with abort_move first.".into())
            }
            Self::KeyChange { .. } => Some("Delete the entry and insert a new one.".into()),
            Self::UnknownState { .. } => Some("state is one of active, migrating, read_only.".into()),
            Self::UnknownShard { shard, .. } => Some(format!(
                "Register it first: INSERT INTO shard_directory.shards (shard_name, region) VALUES ('{shard}', ...)."
            )),
            Self::RegionMismatch { .. } => {
                Some("Pick a shard in the entry's region, or change the entry's region.".into())
            }
            Self::ShardInUse { .. } => Some(
                "Move its entries to other shards (and finish or abort its moves) first: a shard stays registered while anything names it.".into(),
            ),
            Self::UnknownEntity { .. } => {
                Some("Check entity_type and entity_id against shard_directory.shard_directory.".into())
            }
            Self::HistoryAppendOnly { .. } => Some(
                "The extension's owner can remove old rows with shard_directory.purge_history(before).".into(),
            ),
            Self::TruncateRefused { .. } => {
                Some("Delete entries with DELETE so that each one is versioned and recorded.".into())
            }
            Self::TriggersMissing { .. } => Some(
                "Re-enable the triggers on shard_directory.shard_directory, or reinstall the extension.".into(),
            ),
            Self::StaleDirectory { client: None, .. } => Some(
                "Set app.directory_version to the client's directory version in the same transaction \
                 (SELECT set_config('app.directory_version', '42', true))."
                    .into(),
            ),
            Self::StaleDirectory { .. } | Self::StaleEntity { .. } => {
                Some("Refresh the shard directory and retry the transaction.".into())
            }
            Self::EntityFrozen { .. } => {
                Some("A cutover is running for this entity: retry the transaction after a short backoff.".into())
            }
            Self::EntityMoved { version, .. } => Some(format!(
                "Route the transaction to moved_to with a directory version of at least {version}, and retry."
            )),
            Self::InvalidSetting { name, .. } => Some(format!(
                "The client sets {name} with set_config('{name}', <value>, true)."
            )),
            Self::ProtectionBroken { .. } => Some(
                "Re-run shard_directory.protect(table, key_column, entity_type), or unprotect(table).".into(),
            ),
            Self::ObjectMissing { .. } => {
                Some("CREATE EXTENSION shard_directory in this database (or ALTER EXTENSION ... UPDATE).".into())
            }
            Self::PartialEntity { .. } => Some("Set both app.entity_type and app.entity_id, or neither.".into()),
            Self::MinAcceptedNotRaised { .. } => {
                Some("min_accepted only rises: pass a version above the current minimum.".into())
            }
            Self::VersionRegression { .. } => Some(
                "Clients and shards rely on the version moving forward one step per change; changes to shard_directory bump it.".into(),
            ),
            Self::ReplicaWrite { logical: true, .. } => Some(
                "Keep read copies of the directory as physical standbys (streaming replication), where \
                 every read function works; leave the directory's tables out of publications."
                    .into(),
            ),
            Self::ReplicaWrite { .. } => {
                Some("Write the directory with session_replication_role = origin.".into())
            }
            Self::PrepareRefused => Some(
                "COMMIT the directory change on its own, outside the two-phase transaction.".into(),
            ),
            Self::SingletonMissing { .. } => Some(
                "Reinstall the extension (DROP EXTENSION, CREATE EXTENSION) or restore the row from a dump.".into(),
            ),
            Self::TriggerMisused { function, .. } => Some(format!(
                "{function} serves the extension's own tables only: drop this trigger. To check an application table, use shard_directory.protect(table)."
            )),
            Self::ColumnType { table, column, expected, .. } => Some(format!(
                "Give it back its type: ALTER TABLE {table} ALTER COLUMN {column} TYPE {expected}."
            )),
            Self::Spi { .. } => Some(
                "The extension's tables may have been altered by hand: compare them with a fresh CREATE EXTENSION.".into(),
            ),
            Self::FenceWaitTimeout { blockers, .. } if blockers.contains("prepared transaction") => Some(
                "A prepared transaction holds the check's lock until it is resolved: COMMIT PREPARED 'gid' \
                 or ROLLBACK PREPARED 'gid' (as its transaction manager decides), then retry; \
                 terminate the other blocking backends (pg_terminate_backend(pid))."
                    .into(),
            ),
            Self::FenceWaitTimeout { .. } => Some(
                "Finish or terminate the blocking transactions (pg_terminate_backend(pid)) and retry; \
                 shard_directory.fence_wait_timeout sets how long to wait."
                    .into(),
            ),
            Self::TruncateFenced { fence: "frozen", .. } => Some(
                "A cutover is running for this entity: retry after it ends, or delete the other entities' rows with DELETE.".into(),
            ),
            Self::TruncateFenced { .. } => Some(
                "Use DELETE for the entities that live here, or unfence the moved entity once its move is cleaned up.".into(),
            ),
            Self::ProtectNotAllowed { .. } => Some(
                "The table's owner (or a role granted TRIGGER on it) protects it.".into(),
            ),
            Self::UnsupportedKeyType { .. } => Some(
                "Key entities with text, varchar, char(n), smallint, integer, bigint, numeric(p, 0), \
                 uuid or an enum (or a domain over one), in a deterministic collation; keep \
                 case-insensitive ids in one canonical case, as text."
                    .into(),
            ),
            Self::NonCanonicalId { canonical, .. } => Some(format!(
                "Entity ids are the canonical text of their key: use \"{canonical}\" in the directory and on the shards."
            )),
            Self::NotProtectedWithKey { table } => Some(format!(
                "SELECT shard_directory.protect('{table}', '<key column>', '<entity type>')."
            )),
            Self::SequenceNotAllowed { name, role } => Some(format!(
                "GRANT UPDATE ON SEQUENCE {name} TO {role}."
            )),
            Self::DatabaseEncoding { .. } => Some(
                "Create the database with ENCODING 'UTF8' (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0).".into(),
            ),
            _ => None,
        }
    }

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

impl fmt::Display for SdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidTransition { entity, from, to, step } => {
                write!(f, "invalid directory transition for {entity}: {from} -> {to}")?;
                if let Some(step) = step {
                    write!(f, " (requested by {step})")?;
                }
                Ok(())
            }
            Self::InvalidInsert { entity, to } => {
                write!(f, "new directory entry {entity} must be active with no target, not {to}")
            }
            Self::DeleteDuringMove { entity, from } => {
                write!(f, "cannot delete directory entry {entity} while it is {from}")
            }
            Self::KeyChange { from, to } => {
                write!(f, "cannot change a directory entry's key ({from} -> {to})")
            }
            Self::UnknownState { entity, state } => {
                write!(f, "invalid state \"{state}\" for directory entry {entity}")
            }
            Self::UnknownShard { entity, shard } => {
                write!(f, "directory entry {entity} names unknown shard \"{shard}\"")
            }
            Self::ShardInUse { shard, user } => write!(
                f,
                "shard \"{shard}\" cannot leave the registry: {user} names it"
            ),
            Self::RegionMismatch { entity, entity_region, shard, shard_region } => write!(
                f,
                "directory entry {entity} is in region \"{entity_region}\" but shard \"{shard}\" is in region \"{shard_region}\""
            ),
            Self::UnknownEntity { entity, step } => {
                write!(f, "{step}: no directory entry for {entity}")
            }
            Self::NullValue { what } => write!(f, "{what} must not be NULL"),
            Self::HistoryAppendOnly { op } => {
                write!(f, "shard_directory_history is append-only: {op} refused")
            }
            Self::TruncateRefused { table } => write!(f, "TRUNCATE of {table} refused"),
            Self::VersionRegression { from, to } => write!(
                f,
                "shard_directory_version may only increase (from {from} to {to} refused)"
            ),
            Self::VersionRowFixed { op } => {
                write!(f, "shard_directory_version holds exactly one row: {op} refused")
            }
            Self::TriggersMissing { trigger } => write!(
                f,
                "trigger {trigger} on shard_directory.shard_directory is dropped or disabled: \
                 the directory's triggers are incomplete, and a change would not be versioned"
            ),
            Self::StaleDirectory { client, minimum } => write!(
                f,
                "stale shard directory (client {}, minimum {minimum})",
                client.map_or("<NULL>".to_owned(), |c| c.to_string())
            ),
            Self::StaleEntity { entity, client, minimum } => write!(
                f,
                "stale shard directory for {entity} (client {}, minimum {minimum})",
                client.map_or("<NULL>".to_owned(), |c| c.to_string())
            ),
            Self::EntityFrozen { entity } => {
                write!(f, "{entity} is frozen on this shard while its cutover runs")
            }
            Self::EntityMoved { entity, moved_to, version, .. } => write!(
                f,
                "{entity} has moved to shard \"{moved_to}\" (directory version {version})"
            ),
            Self::InvalidSetting { name, value, expected } => {
                write!(f, "invalid value for {name}: \"{value}\" is not {expected}")
            }
            Self::PartialEntity { set, missing } => write!(f, "{set} is set but {missing} is not"),
            Self::MinAcceptedNotRaised { requested, current } => write!(
                f,
                "raise_min_accepted({requested}) refused: min_accepted is already {current}"
            ),
            Self::SettingsRowFixed { op } => {
                write!(f, "shard_settings holds exactly one row: {op} refused")
            }
            Self::UnknownColumn { table, column } => {
                write!(f, "column \"{column}\" of table {table} does not exist")
            }
            Self::ProtectionBroken { trigger, problem } => {
                write!(f, "protect trigger {trigger}: {problem}")
            }
            Self::ObjectMissing { name } => write!(f, "shard_directory.{name} does not exist in this database"),
            Self::ReplicaWrite { table, logical: true } => write!(
                f,
                "shard_directory.{table} cannot be written by logical replication: a copy of the \
                 directory would have no versions, history or notifications of its own"
            ),
            Self::ReplicaWrite { table, .. } => write!(
                f,
                "shard_directory.{table} cannot be written with session_replication_role = replica: \
                 the directory's rules, versions, history and notifications would not be made"
            ),
            Self::PrepareRefused => write!(
                f,
                "a transaction that changed shard_directory.shard_directory cannot be prepared: \
                 its versions are taken and notified when it commits"
            ),
            Self::SingletonMissing { table } => {
                write!(f, "shard_directory.{table} has lost its row")
            }
            Self::ColumnType { table, column, expected, found } => write!(
                f,
                "column {column} of {table} is {found}, but the extension reads and writes it as {expected}"
            ),
            Self::TriggerMisused { function, table } => write!(
                f,
                "trigger function shard_directory.{function}() refuses to run on {table}"
            ),
            Self::Spi { during, cause, .. } => write!(f, "shard_directory: {during} failed: {cause}"),
            Self::FenceWaitTimeout { what, waited_ms, blockers } => write!(
                f,
                "{what} gave up after waiting {waited_ms} ms for checked transactions in flight: {blockers}"
            ),
            Self::TruncateFenced { table, entity, fence } => write!(
                f,
                "TRUNCATE of {table} refused: {entity} is fenced {fence} on this shard, and TRUNCATE would wipe its rows"
            ),
            Self::ProtectNotAllowed { table, role } => write!(
                f,
                "role \"{role}\" may not protect or unprotect {table}: it lacks the TRIGGER privilege on it"
            ),
            Self::NotATable { table } => write!(
                f,
                "{table} is not a table: protect() accepts tables and partitioned tables"
            ),
            Self::UnsupportedKeyType { column, type_name, why } => write!(
                f,
                "key column {column} has type {type_name}, which cannot key an entity: {why}"
            ),
            Self::NonCanonicalId { entity, column, type_name, canonical } => write!(
                f,
                "entity id \"{}\" of {entity} is not canonical for key column {column} ({type_name}), \
                 which reads it as \"{canonical}\"",
                entity.entity_id
            ),
            Self::NotProtectedWithKey { table } => {
                write!(f, "table {table} is not protected with a key column")
            }
            Self::NotASequence { name } => write!(f, "{name} is not a sequence"),
            Self::SequenceNotAllowed { name, role } => write!(
                f,
                "role \"{role}\" may not advance sequence {name}: it lacks the UPDATE privilege on it"
            ),
            Self::DatabaseEncoding { encoding } => write!(
                f,
                "shard_directory needs a UTF8 database, not {encoding}: entity ids are compared as UTF-8 text"
            ),
        }
    }
}
