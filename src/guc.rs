//! Every setting the extension defines or reads.

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `shard_directory.allow_repoint`: lets a DBA re-point an entry directly (emergency only).
pub static ALLOW_REPOINT: GucSetting<bool> = GucSetting::<bool>::new(false);

pub fn init() {
    GucRegistry::define_bool_guc(
        c"shard_directory.allow_repoint",
        c"Permit a direct re-point of a directory entry, bypassing the move state machine.",
        c"Emergency use only: SET LOCAL shard_directory.allow_repoint = on in the transaction that \
          re-points. History records such changes as 'repoint'.",
        &ALLOW_REPOINT,
        GucContext::Userset,
        GucFlags::default(),
    );
}
