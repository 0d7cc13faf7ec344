//! In-database tests: each runs inside one transaction of a real backend, so they cover the
//! rules within a transaction. What needs commits or several sessions (notifications, races,
//! `placement_at` across transactions) is in the end-to-end suite under `tests/`.

#[pgrx::pg_schema]
mod tests {
    use pgrx::pg_sys::panic::CaughtError;
    use pgrx::prelude::*;
    use pgrx::PgSqlErrorCode;
    use PgSqlErrorCode::*;

    /// What a refused statement raised.
    pub struct Refusal {
        pub code: PgSqlErrorCode,
        pub message: String,
        pub hint: Option<String>,
    }

    /// Runs `sql` in a subtransaction (as PL/pgSQL's EXCEPTION block does) and returns the error it
    /// raised; panics if it succeeded. The subtransaction's work is rolled back either way.
    pub fn refusal(sql: &str) -> Refusal {
        let (ctx, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
        unsafe {
            pg_sys::BeginInternalSubTransaction(std::ptr::null());
            pg_sys::MemoryContextSwitchTo(ctx);
        }
        let caught = PgTryBuilder::new(|| {
            Spi::run(sql).expect("SPI");
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
                hint: r.hint().map(str::to_owned),
            },
        }
    }

    fn one<T: IntoDatum + FromDatum>(sql: &str) -> T {
        Spi::get_one::<T>(sql)
            .expect("SPI")
            .expect("a non-NULL value")
    }

    fn version() -> i64 {
        one("SELECT shard_directory.current_version()")
    }

    /// The row as `state|shard|target|version`, to show a refused step changed nothing.
    fn entry(id: &str) -> String {
        one(&format!(
            "SELECT concat_ws('|', state, shard_name, coalesce(target_shard, '-'), version) \
             FROM shard_directory.shard_directory WHERE entity_type = 'tenant' AND entity_id = '{id}'"
        ))
    }

    fn setup() {
        Spi::run(
            "INSERT INTO shard_directory.shards (shard_name, region) VALUES \
               ('shard_1', 'eu'), ('shard_2', 'eu'), ('shard_3', 'us'), ('shard_4', NULL); \
             INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name, region) VALUES \
               ('tenant', '1', 'shard_1', 'eu'), ('tenant', '2', 'shard_1', 'eu'), ('tenant', '3', 'shard_2', NULL)",
        )
        .expect("setup");
    }

    /// Asserts `sql` is refused with `code`, names what `message_parts` say, and changed nothing.
    fn assert_refused(sql: &str, code: PgSqlErrorCode, message_parts: &[&str]) -> Refusal {
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

    #[pg_test]
    fn one_statement_bumps_the_version_once_and_stamps_every_changed_entry() {
        setup();
        let before = version();
        Spi::run("UPDATE shard_directory.shard_directory SET region = region WHERE entity_type = 'tenant'")
            .unwrap();
        assert_eq!(version(), before + 1);
        let stamped: i64 = one(&format!(
            "SELECT count(*) FROM shard_directory.shard_directory WHERE version = {}",
            before + 1
        ));
        assert_eq!(stamped, 3);
        // whatever the statement itself wrote into version is overwritten
        Spi::run("UPDATE shard_directory.shard_directory SET version = 999 WHERE entity_id = '1'")
            .unwrap();
        assert_eq!(entry("1"), format!("active|shard_1|-|{}", before + 2));
    }

    #[pg_test]
    fn a_statement_that_changes_nothing_bumps_nothing() {
        setup();
        let before = version();
        Spi::run(
            "UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = 'nope'",
        )
        .unwrap();
        Spi::run("DELETE FROM shard_directory.shard_directory WHERE entity_id = 'nope'").unwrap();
        assert_eq!(version(), before);
        let notified: i64 =
            one("SELECT count(*) FROM shard_directory.shard_directory_history WHERE version > 1");
        assert_eq!(notified, 0);
    }

    #[pg_test]
    fn updated_by_and_updated_at_cannot_be_forged() {
        setup();
        Spi::run(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name, updated_by, updated_at) \
             VALUES ('tenant', '9', 'shard_4', 'mallory', '2001-01-01')",
        )
        .unwrap();
        Spi::run(
            "UPDATE shard_directory.shard_directory SET updated_by = 'mallory', updated_at = '2001-01-01' \
             WHERE entity_id = '1'",
        )
        .unwrap();
        let honest: i64 = one("SELECT count(*) FROM shard_directory.shard_directory \
             WHERE entity_id IN ('1', '9') AND updated_by = current_user AND updated_at = now()");
        assert_eq!(honest, 2);
    }

    #[pg_test]
    fn refused_steps_carry_their_sqlstate_and_change_nothing() {
        setup();
        let r = assert_refused(
            "UPDATE shard_directory.shard_directory SET shard_name = 'shard_2' WHERE entity_id = '1'",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/1", "active on shard_1 -> active on shard_2"],
        );
        assert!(r.hint.unwrap().contains("begin_move"));
        assert_refused(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name, state, target_shard) \
             VALUES ('tenant', '7', 'shard_1', 'migrating', 'shard_2')",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/7", "migrating"],
        );
        assert_refused(
            "UPDATE shard_directory.shard_directory SET state = 'read_only', target_shard = 'shard_2' WHERE entity_id = '1'",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/1", "active on shard_1 -> read_only on shard_1 (target shard_2)"],
        );
        assert_refused(
            "SELECT shard_directory.begin_move('tenant', '1', 'shard_9')",
            ERRCODE_FOREIGN_KEY_VIOLATION,
            &["tenant/1", "shard_9"],
        );
        assert_refused(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', '8', 'nope')",
            ERRCODE_FOREIGN_KEY_VIOLATION,
            &["tenant/8", "nope"],
        );
        assert_refused(
            "SELECT shard_directory.begin_move('tenant', '1', 'shard_3')",
            ERRCODE_CHECK_VIOLATION,
            &["tenant/1", "eu", "shard_3", "us"],
        );
        assert_refused(
            "SELECT shard_directory.begin_move('tenant', '1', 'shard_1')",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/1", "begin_move"],
        );
        assert_refused(
            "UPDATE shard_directory.shard_directory SET state = 'moving' WHERE entity_id = '1'",
            ERRCODE_CHECK_VIOLATION,
            &["moving", "tenant/1"],
        );
        assert_refused(
            "UPDATE shard_directory.shard_directory SET entity_id = '11' WHERE entity_id = '1'",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/1", "tenant/11"],
        );
        assert_refused(
            "SELECT shard_directory.freeze('tenant', 'nope')",
            ERRCODE_NO_DATA_FOUND,
            &["tenant/nope", "freeze"],
        );
        assert_refused(
            "SELECT shard_directory.begin_move(NULL, '1', 'shard_2')",
            ERRCODE_NULL_VALUE_NOT_ALLOWED,
            &["entity_type"],
        );
        assert_refused(
            "TRUNCATE shard_directory.shard_directory",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["shard_directory.shard_directory"],
        );
        // mid-move: skipping the freeze, deleting, and re-targeting are all refused
        Spi::run("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')").unwrap();
        assert_refused(
            "SELECT shard_directory.complete_move('tenant', '1')",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &[
                "tenant/1",
                "migrating on shard_1 (target shard_2) -> active on shard_2",
                "complete_move",
            ],
        );
        assert_refused(
            "DELETE FROM shard_directory.shard_directory WHERE entity_id = '1'",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/1", "migrating"],
        );
        assert_refused(
            "UPDATE shard_directory.shard_directory SET target_shard = 'shard_4' WHERE entity_id = '1'",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/1"],
        );
    }

    #[pg_test]
    fn the_full_move_walk_returns_each_new_version() {
        setup();
        let v0 = version();
        let v1: i64 = one("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')");
        assert_eq!(
            (v1, entry("1")),
            (v0 + 1, format!("migrating|shard_1|shard_2|{v1}"))
        );
        let v2: i64 = one("SELECT shard_directory.freeze('tenant', '1')");
        assert_eq!(
            (v2, entry("1")),
            (v1 + 1, format!("read_only|shard_1|shard_2|{v2}"))
        );
        let v3: i64 = one("SELECT shard_directory.complete_move('tenant', '1')");
        assert_eq!((v3, entry("1")), (v2 + 1, format!("active|shard_2|-|{v3}")));
        let transitions: String = one(
            "SELECT string_agg(transition || ':' || coalesce(old_shard, '-') || '>' || new_shard, ' ' ORDER BY history_id) \
             FROM shard_directory.shard_directory_history WHERE entity_id = '1'",
        );
        assert_eq!(transitions, "insert:->shard_1 begin_move:shard_1>shard_1 freeze:shard_1>shard_1 cutover:shard_1>shard_2");
    }

    #[pg_test]
    fn both_aborts_return_the_entry_to_its_source() {
        setup();
        Spi::run("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')").unwrap();
        let v: i64 = one("SELECT shard_directory.abort_move('tenant', '1')");
        assert_eq!(entry("1"), format!("active|shard_1|-|{v}"));

        Spi::run("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')").unwrap();
        Spi::run("SELECT shard_directory.freeze('tenant', '1')").unwrap();
        let v: i64 = one("SELECT shard_directory.abort_move('tenant', '1')");
        assert_eq!(entry("1"), format!("active|shard_1|-|{v}"));
        // nothing left to abort
        assert_refused(
            "SELECT shard_directory.abort_move('tenant', '1')",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["tenant/1", "abort_move"],
        );
    }

    #[pg_test]
    fn maintenance_freeze_and_release() {
        setup();
        let v: i64 = one("SELECT shard_directory.freeze('tenant', '1')");
        assert_eq!(entry("1"), format!("read_only|shard_1|-|{v}"));
        let v: i64 = one("SELECT shard_directory.abort_move('tenant', '1')");
        assert_eq!(entry("1"), format!("active|shard_1|-|{v}"));
    }

    #[pg_test]
    fn allow_repoint_permits_a_direct_repoint_and_history_records_it() {
        setup();
        Spi::run("SET LOCAL shard_directory.allow_repoint = on").unwrap();
        Spi::run("UPDATE shard_directory.shard_directory SET shard_name = 'shard_2' WHERE entity_id = '1'").unwrap();
        let last: String = one(
            "SELECT transition || ':' || old_shard || '>' || new_shard FROM shard_directory.shard_directory_history \
             WHERE entity_id = '1' ORDER BY history_id DESC LIMIT 1",
        );
        assert_eq!(last, "repoint:shard_1>shard_2");
        Spi::run("SET LOCAL shard_directory.allow_repoint = off").unwrap();
    }

    #[pg_test]
    fn history_records_every_change_and_cannot_be_rewritten() {
        setup();
        Spi::run("UPDATE shard_directory.shard_directory SET region = NULL WHERE entity_id = '2'")
            .unwrap();
        Spi::run("DELETE FROM shard_directory.shard_directory WHERE entity_id = '2'").unwrap();
        let deleted_at = version();
        let rows: String = one(
            "SELECT string_agg(concat_ws(',', op, old_shard, old_state, new_shard, new_state, old_region, new_region, version), ' ' ORDER BY history_id) \
             FROM shard_directory.shard_directory_history WHERE entity_id = '2'",
        );
        assert_eq!(
            rows,
            format!("insert,shard_1,active,eu,1 update,shard_1,active,shard_1,active,eu,2 delete,shard_1,active,{deleted_at}")
        );
        for sql in [
            "UPDATE shard_directory.shard_directory_history SET new_shard = 'x'",
            "DELETE FROM shard_directory.shard_directory_history",
            "INSERT INTO shard_directory.shard_directory_history (op, transition, entity_type, entity_id, version) \
             VALUES ('insert', 'insert', 'tenant', 'forged', 1)",
            "TRUNCATE shard_directory.shard_directory_history",
        ] {
            assert_eq!(refusal(sql).code, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "{sql}");
        }
        let purged: i64 = one("SELECT shard_directory.purge_history(now() + interval '1 second')");
        assert_eq!(purged, 5);
    }

    #[pg_test]
    fn the_version_only_moves_forward() {
        setup();
        for sql in [
            "UPDATE shard_directory.shard_directory_version SET version = 0",
            "DELETE FROM shard_directory.shard_directory_version",
            "INSERT INTO shard_directory.shard_directory_version (id, version) VALUES (false, 5)",
            "TRUNCATE shard_directory.shard_directory_version",
        ] {
            assert_eq!(
                refusal(sql).code,
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "{sql}"
            );
        }
    }
}
