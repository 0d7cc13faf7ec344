//! Acting on a caller's behalf with the rights of the role that owns the extension's tables.
//!
//! A directory writer needs privileges on `shard_directory` alone, and an application role on a
//! shard none on the extension's tables: the version bump, the history row, the notification and
//! the shard's reads of its own state are done as the owner of the table they touch, the way
//! PostgreSQL runs a foreign-key check. `search_path` is pinned for the duration so that no
//! operator or function the caller put on their path can run with those rights.

use pgrx::pg_sys;

use crate::error::SdError;

/// The role that owns `relid`.
fn owner_of(relid: pg_sys::Oid) -> pg_sys::Oid {
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as _,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            SdError::ObjectMissing {
                name: format!("relation {}", relid.to_u32()),
            }
            .raise();
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple)).relowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}

/// The role the session acts as now (what `current_user` says).
pub fn current_role() -> pg_sys::Oid {
    unsafe { pg_sys::GetUserId() }
}

/// Runs `f` as the owner of `relid`, with `search_path = pg_catalog, pg_temp`. On an error the
/// transaction's (or subtransaction's) abort restores the role and the setting, as it does for a
/// SECURITY DEFINER function.
pub fn as_owner_of<R>(relid: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    let owner = owner_of(relid);
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            context
                | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
        );
    }
    let nest = unsafe { pg_sys::NewGUCNestLevel() };
    unsafe {
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
    }
    let result = f();
    unsafe {
        pg_sys::AtEOXact_GUC(true, nest);
        pg_sys::SetUserIdAndSecContext(user, context);
    }
    result
}

/// Whether the role running the statement owns `relid` (or is a superuser): only such a role
/// restores rows from a dump.
pub fn current_role_owns(relid: pg_sys::Oid) -> bool {
    #[cfg(feature = "pg15")]
    let owns = unsafe { pg_sys::pg_class_ownercheck(relid, current_role()) };
    // 16 checks the owner of any catalog's object through one function.
    #[cfg(not(feature = "pg15"))]
    let owns =
        unsafe { pg_sys::object_ownercheck(pg_sys::RelationRelationId, relid, current_role()) };
    owns
}

/// The name of `role`.
pub fn role_name(role: pg_sys::Oid) -> String {
    unsafe {
        std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(role, false))
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether `role` holds `mode` (an `ACL_*` bit) on `relid`, directly or through a role.
pub fn has_table_privilege(relid: pg_sys::Oid, role: pg_sys::Oid, mode: u32) -> bool {
    unsafe {
        pg_sys::pg_class_aclcheck(relid, role, mode as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    }
}
