//! The one table of SQLSTATEs: what every error is raised with.

use pgrx::PgSqlErrorCode;

use super::SdError;

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
            | Self::ReplicaWrite { .. }
            | Self::LogicalReplicaWrite { .. }
            | Self::PublishedDirectory { .. } => ERRCODE_FEATURE_NOT_SUPPORTED,
            Self::NonCanonicalId { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            Self::NotProtectedWithKey { .. } => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            Self::DifferentKeys { .. } => ERRCODE_INVALID_TABLE_DEFINITION,
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
}
