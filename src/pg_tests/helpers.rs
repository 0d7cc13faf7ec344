//! What the in-database tests share: running SQL as a change or as a refusal, reading a value,
//! the directory every directory test starts from, a client's settings on a shard.

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// What a refused statement raised.
pub struct Refusal {
    pub code: PgSqlErrorCode,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

/// Runs `sql` in a subtransaction (as PL/pgSQL's EXCEPTION block does), versioning what it
/// changed as a commit would, and returns the error it raised; panics if it succeeded. The
/// subtransaction's work is rolled back either way.
pub fn refusal(sql: &str) -> Refusal {
    let (ctx, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(ctx);
    }
    let caught = PgTryBuilder::new(|| {
        change(sql);
        None
    })
    .catch_others(Some)
    .execute();
    unsafe {
        pg_sys::RollbackAndReleaseCurrentSubTransaction();
        pg_sys::MemoryContextSwitchTo(ctx);
        pg_sys::CurrentResourceOwner = owner;
    }
    match caught {
        None => panic!("expected `{sql}` to be refused, but it succeeded"),
        Some(
            CaughtError::PostgresError(r)
            | CaughtError::ErrorReport(r)
            | CaughtError::RustPanic { ereport: r, .. },
        ) => Refusal {
            code: r.sql_error_code(),
            message: r.message().to_owned(),
            detail: r.detail().map(str::to_owned),
            hint: r.hint().map(str::to_owned),
        },
    }
}

/// Runs `sql`, then versions the directory changes it made as its transaction's commit would
/// (`version::settle`): each test is one transaction, and a change gets its version when
/// its transaction commits.
pub fn change(sql: &str) {
    Spi::run(sql).expect("SPI");
    crate::directory::version::settle();
}

pub fn one<T: IntoDatum + FromDatum>(sql: &str) -> T {
    Spi::get_one::<T>(sql)
        .expect("SPI")
        .expect("a non-NULL value")
}

pub fn version() -> i64 {
    one("SELECT shard_directory.current_version()")
}

/// The row as `state|shard|target|version`, to show a refused step changed nothing.
pub fn entry(id: &str) -> String {
    one(&format!(
        "SELECT concat_ws('|', state, shard_name, coalesce(target_shard, '-'), version) \
         FROM shard_directory.shard_directory WHERE entity_type = 'tenant' AND entity_id = '{id}'"
    ))
}

pub fn setup() {
    change(
        "INSERT INTO shard_directory.shards (shard_name, region) VALUES \
           ('shard_1', 'eu'), ('shard_2', 'eu'), ('shard_3', 'us'), ('shard_4', NULL); \
         INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name, region) VALUES \
           ('tenant', '1', 'shard_1', 'eu'), ('tenant', '2', 'shard_1', 'eu'), ('tenant', '3', 'shard_2', NULL)",
    );
}

/// Asserts `sql` is refused with `code`, names what `message_parts` say, and changed nothing.
pub fn assert_refused(sql: &str, code: PgSqlErrorCode, message_parts: &[&str]) -> Refusal {
    let (v, rows) = (version(), [entry("1"), entry("2"), entry("3")]);
    let r = refusal(sql);
    assert_eq!(r.code, code, "`{sql}` raised {:?}: {}", r.code, r.message);
    for part in message_parts {
        assert!(
            r.message.contains(part),
            "message `{}` should name `{part}`",
            r.message
        );
    }
    assert_eq!(version(), v, "`{sql}` must not bump the version");
    assert_eq!(
        [entry("1"), entry("2"), entry("3")],
        rows,
        "`{sql}` must change nothing"
    );
    r
}

pub fn client(version: &str) {
    Spi::run_with_args(
        "SELECT set_config('app.directory_version', $1, true)",
        &[version.into()],
    )
    .unwrap();
}

pub fn entity(id: &str) {
    Spi::run_with_args(
        "SELECT set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', $1, true)",
        &[id.into()],
    )
    .unwrap();
}

pub const CHECK: &str = "SELECT shard_directory.assert_directory_version()";
pub fn json(detail: Option<String>) -> serde_json::Value {
    serde_json::from_str(&detail.expect("a DETAIL")).expect("DETAIL is JSON")
}
