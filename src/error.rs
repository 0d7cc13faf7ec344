//! Every error the extension raises, in one place: a stable SQLSTATE, a message that names the
//! entity and the states or versions involved, and a HINT where the user has a next step.

use std::fmt;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::directory::transition::{EntityKey, Placement};

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
    /// A row trigger ran without its statement trigger (someone dropped or disabled one).
    TriggersMissing,
    /// `purge_history` is for the extension's owner.
    NotExtensionOwner {
        role: String,
    },
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
            | Self::TriggersMissing => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            Self::UnknownState { .. } | Self::RegionMismatch { .. } => ERRCODE_CHECK_VIOLATION,
            Self::UnknownShard { .. } => ERRCODE_FOREIGN_KEY_VIOLATION,
            Self::UnknownEntity { .. } => ERRCODE_NO_DATA_FOUND,
            Self::NullValue { .. } => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            Self::NotExtensionOwner { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
        }
    }

    pub fn detail(&self) -> Option<String> {
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
            Self::UnknownEntity { .. } => {
                Some("Check entity_type and entity_id against shard_directory.shard_directory.".into())
            }
            Self::HistoryAppendOnly { .. } => Some(
                "The extension's owner can remove old rows with shard_directory.purge_history(before).".into(),
            ),
            Self::TruncateRefused { .. } => {
                Some("Delete entries with DELETE so that each one is versioned and recorded.".into())
            }
            Self::TriggersMissing => Some(
                "Re-enable the triggers on shard_directory.shard_directory, or reinstall the extension.".into(),
            ),
            Self::VersionRegression { .. } => Some(
                "Clients and shards rely on the version never going back; changes to shard_directory bump it.".into(),
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
            Self::TriggersMissing => f.write_str(
                "shard_directory's statement trigger did not run: the directory's triggers are incomplete",
            ),
            Self::NotExtensionOwner { role } => write!(
                f,
                "role \"{role}\" may not purge history: only the owner of extension shard_directory can"
            ),
        }
    }
}
