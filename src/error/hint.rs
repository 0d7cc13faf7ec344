//! The HINT of an error: the user's next step.

use crate::directory::placement::Placement;

use super::SdError;

fn allowed_steps(from: &Placement) -> &'static str {
    use shard_directory_protocol::State::*;
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
            Self::LogicalReplicaWrite { .. } | Self::PublishedDirectory { .. } => Some(
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
            Self::DifferentKeys { .. } => Some(
                "Inherit from tables protected for one entity type with one key column, or \
                 protect them alike."
                    .into(),
            ),
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
}
