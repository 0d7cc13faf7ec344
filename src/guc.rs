//! Every setting the extension defines or reads.

use std::ffi::{CStr, CString};

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use shard_directory_protocol::setting;

use crate::entity::EntityRef;
use crate::error::SdError;

/// `shard_directory.allow_repoint`: lets a DBA re-point an entry directly (emergency only).
pub static ALLOW_REPOINT: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `shard_directory.fence_wait_timeout`: how long a fence change or `raise_min_accepted` waits
/// for the checked transactions in flight (new checked transactions queue behind it meanwhile).
pub static FENCE_WAIT_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(2000);

/// `shard_directory.entity_stats`: count each entity's checked transactions (`entity_stats()`).
pub static ENTITY_STATS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `shard_directory.entity_stats_window`: the window `entity_stats()` counts over, in seconds.
pub static ENTITY_STATS_WINDOW: GucSetting<i32> = GucSetting::<i32>::new(300);

/// The client's declaration for its transaction: `app.directory_version`, `app.entity_type`,
/// `app.entity_id` (the first is the guide's setting; the entity's follow its naming). Defined here rather than left as placeholders so that a
/// check reads them from these variables instead of searching the settings by name three times
/// per call (most of the check's cost on PostgreSQL 15); SET, `set_config` and `current_setting`
/// behave as before, and a value set before the library loaded is carried over.
static APP_DIRECTORY_VERSION: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
static APP_ENTITY_TYPE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static APP_ENTITY_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

pub fn init() {
    for (name, short, setting) in [
        (
            setting::DIRECTORY_VERSION.as_c_str(),
            c"The directory version the client routed this transaction with.",
            &APP_DIRECTORY_VERSION,
        ),
        (
            setting::ENTITY_TYPE.as_c_str(),
            c"The type of the entity this transaction works on (with app.entity_id).",
            &APP_ENTITY_TYPE,
        ),
        (
            setting::ENTITY_ID.as_c_str(),
            c"The id of the entity this transaction works on (with app.entity_type).",
            &APP_ENTITY_ID,
        ),
    ] {
        GucRegistry::define_string_guc(
            name,
            short,
            c"Set by the client with set_config(name, value, true) in the transaction it routes; \
              shard_directory's check compares it with the shard's fences.",
            setting,
            GucContext::Userset,
            GucFlags::default(),
        );
    }
    GucRegistry::define_bool_guc(
        setting::ALLOW_REPOINT.as_c_str(),
        c"Permit a direct re-point of a directory entry, bypassing the move state machine.",
        c"Emergency use only: SET LOCAL shard_directory.allow_repoint = on in the transaction that \
          re-points. History records such changes as 'repoint'.",
        &ALLOW_REPOINT,
        // Superusers, and roles granted SET ON PARAMETER shard_directory.allow_repoint.
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        setting::FENCE_WAIT_TIMEOUT.as_c_str(),
        c"How long a fence change or raise_min_accepted waits for checked transactions in flight.",
        c"Checked transactions that start meanwhile queue behind it, so the wait is bounded: past it \
          the change fails with SQLSTATE 55P03 naming the blocking backends.",
        &FENCE_WAIT_TIMEOUT,
        1,
        600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        setting::ENTITY_STATS.as_c_str(),
        c"Count each entity's checked transactions, for shard_directory.entity_stats().",
        c"One comparison per check, and a short exclusive section once per transaction and entity.",
        &ENTITY_STATS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        setting::ENTITY_STATS_WINDOW.as_c_str(),
        c"The window shard_directory.entity_stats() counts over.",
        c"The counts turn over a whole window at a time; entity_stats() shows the current window \
          and the one before it.",
        &ENTITY_STATS_WINDOW,
        1,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
}

/// What a client declared for this transaction through `set_config(.., true)`.
pub struct Request {
    /// `app.directory_version`; `None` when unset or empty (a transaction-local setting reads
    /// as '' once its transaction is over).
    pub version: Option<i64>,
    /// `app.entity_type` + `app.entity_id`, when both are set. Borrowed from the settings, which
    /// cannot change while the check reads them.
    pub entity: Option<EntityRef<'static>>,
}

fn setting(setting: &GucSetting<Option<CString>>) -> Option<&'static str> {
    // SAFETY: the variable holds NULL or a string owned by the GUC machinery that stays valid
    // until the setting changes, which cannot happen while the check reads it.
    let value = unsafe { *setting.as_ptr() };
    if value.is_null() {
        return None;
    }
    let value = unsafe { CStr::from_ptr(value) }
        .to_str()
        .unwrap_or("\u{fffd}");
    (!value.is_empty()).then_some(value)
}

/// A directory version is a non-negative 64-bit integer; anything else is a client bug that a
/// retry cannot fix, so it is 22023, not 40001.
fn parse_version(raw: &str) -> Result<i64, SdError> {
    raw.trim()
        .parse::<i64>()
        .ok()
        .filter(|v| *v >= 0)
        .ok_or_else(|| SdError::InvalidSetting {
            name: "app.directory_version",
            value: raw.to_owned(),
            expected: "a non-negative 64-bit integer",
        })
}

impl Request {
    pub fn read() -> Result<Request, SdError> {
        let version = setting(&APP_DIRECTORY_VERSION)
            .map(parse_version)
            .transpose()?;
        let entity = match (setting(&APP_ENTITY_TYPE), setting(&APP_ENTITY_ID)) {
            (Some(t), Some(id)) => Some(EntityRef {
                entity_type: t,
                entity_id: id,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(SdError::PartialEntity {
                    set: "app.entity_type",
                    missing: "app.entity_id",
                })
            }
            (None, Some(_)) => {
                return Err(SdError::PartialEntity {
                    set: "app.entity_id",
                    missing: "app.entity_type",
                })
            }
        };
        Ok(Request { version, entity })
    }
}

#[cfg(test)]
mod unit {
    use super::parse_version;

    #[test]
    fn versions_are_non_negative_64_bit_integers() {
        assert_eq!(parse_version("42"), Ok(42));
        assert_eq!(parse_version(" 7 "), Ok(7));
        for bad in ["abc", "-1", "123456789012345678901234567890", "4.2", "0x10"] {
            assert!(parse_version(bad).is_err(), "{bad}");
        }
    }
}
