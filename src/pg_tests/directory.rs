//! The directory role: versions, history, the move steps, `changes_since`, the registry's rules,
//! the extension's own tables as a DBA might alter them.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::PgSqlErrorCode::*;

    use crate::pg_tests::helpers::*;

    #[pg_test]
    fn one_statement_bumps_the_version_once_and_stamps_every_changed_entry() {
        setup();
        let before = version();
        change(
            "UPDATE shard_directory.shard_directory \
             SET region = CASE WHEN region IS NULL THEN 'eu' END WHERE entity_type = 'tenant'",
        );
        assert_eq!(version(), before + 1);
        let stamped: i64 = one(&format!(
            "SELECT count(*) FROM shard_directory.shard_directory WHERE version = {}",
            before + 1
        ));
        assert_eq!(stamped, 3);
        // whatever the statement itself wrote into version is overwritten
        change(
            "UPDATE shard_directory.shard_directory SET version = 999, region = 'eu' WHERE entity_id = '1'",
        );
        assert_eq!(entry("1"), format!("active|shard_1|-|{}", before + 2));
        // and a write of version alone changes nothing: the stored stamp stays
        change("UPDATE shard_directory.shard_directory SET version = 999 WHERE entity_id = '1'");
        assert_eq!(entry("1"), format!("active|shard_1|-|{}", before + 2));
        assert_eq!(version(), before + 2);
    }

    /// A statement changing more entries than a transaction keeps waiting in memory takes its
    /// version when it passes them, before its commit: every entry and history row still carry
    /// the one version it got.
    #[pg_test]
    fn a_change_of_more_entries_than_wait_in_memory_takes_its_version_at_once() {
        use crate::directory::version::WAITING_LIMIT;
        setup();
        let v = version();
        let n = WAITING_LIMIT as i64 + 2_500;
        Spi::run(&format!(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             SELECT 'bulk', g::text, 'shard_1' FROM generate_series(1, {n}) g"
        ))
        .unwrap();
        assert_eq!(version(), v + 1, "taken before the commit");
        let stamped = |table: &str| -> i64 {
            one(&format!(
                "SELECT count(*) FILTER (WHERE version = {}) - count(*) FILTER (WHERE version <> {}) \
                 FROM shard_directory.{table} WHERE entity_type = 'bulk'",
                v + 1,
                v + 1
            ))
        };
        assert_eq!(
            (
                stamped("shard_directory"),
                stamped("shard_directory_history")
            ),
            (n, n)
        );
    }

    /// Rows an upsert skips bump nothing, and a WITH statement (or an upsert that updates) gets
    /// one version for all it changes.
    #[pg_test]
    fn skipped_rows_bump_nothing_and_a_with_statement_gets_one_version() {
        setup();
        let before = version();
        let history = || one::<i64>("SELECT count(*) FROM shard_directory.shard_directory_history");
        let rows = history();
        for sql in [
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', '1', 'shard_1') ON CONFLICT DO NOTHING",
            "UPDATE shard_directory.shard_directory SET region = region, state = state",
        ] {
            change(sql);
            assert_eq!(version(), before, "{sql}");
            assert_eq!(history(), rows, "{sql}");
        }
        // a skipped row beside a written one: the written one keeps the statement's version
        change(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', '1', 'shard_1'), ('tenant', '4', 'shard_1') ON CONFLICT DO NOTHING",
        );
        assert_eq!(version(), before + 1);
        assert_eq!(entry("4"), format!("active|shard_1|-|{}", before + 1));

        // one WITH statement inserting, updating and deleting: one version for all of it
        change(
            "WITH a AS (UPDATE shard_directory.shard_directory SET region = NULL WHERE entity_id = '1' RETURNING 1), \
                  b AS (DELETE FROM shard_directory.shard_directory WHERE entity_id = '4' RETURNING 1) \
             INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             SELECT 'tenant', '5', 'shard_2' FROM a, b",
        );
        assert_eq!(version(), before + 2);
        let versions: String = one(&format!(
            "SELECT string_agg(DISTINCT version::text, ',') FROM shard_directory.shard_directory_history \
             WHERE version > {before} + 1"
        ));
        assert_eq!(versions, (before + 2).to_string());
        assert_eq!(history(), rows + 4);
        // an upsert that updates: one version too
        change(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name, region) \
             VALUES ('tenant', '5', 'shard_2', 'eu') \
             ON CONFLICT (entity_type, entity_id) DO UPDATE SET region = excluded.region",
        );
        assert_eq!(version(), before + 3);
        assert_eq!(entry("5"), format!("active|shard_2|-|{}", before + 3));
    }

    #[pg_test]
    fn a_statement_that_changes_nothing_bumps_nothing() {
        setup();
        let before = version();
        change("UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = 'nope'");
        change("DELETE FROM shard_directory.shard_directory WHERE entity_id = 'nope'");
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

    /// Each TRUNCATE runs while this transaction holds no lock on its table: upgrading
    /// a lock to TRUNCATE's could deadlock with the tests running beside this one.
    #[pg_test]
    fn no_directory_table_can_be_truncated() {
        for table in [
            "shard_directory.shard_directory",
            "shard_directory.shard_directory_history",
            "shard_directory.shard_directory_version",
        ] {
            let r = refusal(&format!("TRUNCATE {table}"));
            assert_eq!(r.code, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "{table}");
            assert!(r.message.contains(table), "{}", r.message);
        }
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

    /// What `changes_since(since)` says, as `complete|type:id@version ...` (keys sorted).
    fn changes(since: i64, max_changes: i32) -> String {
        one(&format!(
            "SELECT c.complete || '|' || coalesce((SELECT string_agg(t || ':' || i || '@' || v, ' ' ORDER BY i) \
               FROM unnest(c.entity_types, c.entity_ids, c.versions) AS k(t, i, v)), '') \
             FROM shard_directory.changes_since({since}, {max_changes}) c"
        ))
    }

    /// What routers read to retire only the entries that changed.
    #[pg_test]
    fn changes_since_lists_each_changed_key_once_and_says_when_history_cannot_tell() {
        setup();
        let v0 = version();
        let v1: i64 = one("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')");
        change(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', '4', 'shard_4')",
        );
        let v3: i64 = one("SELECT shard_directory.freeze('tenant', '1')");
        assert_eq!(
            changes(v0, 10_000),
            format!("true|tenant:1@{v3} tenant:4@{}", v1 + 1)
        );
        assert_eq!(
            changes(v1, 10_000),
            format!("true|tenant:1@{v3} tenant:4@{}", v1 + 1)
        );
        assert_eq!(changes(v3, 10_000), "true|", "nothing after the latest");
        assert_eq!(changes(v0, 2), "false|", "three changes are more than two");
        // The setup's versions and the three above are purged: from v0 the gap is no longer
        // covered; from v3 on, it is.
        let purged: i64 = one("SELECT shard_directory.purge_history(clock_timestamp())");
        assert!(purged >= 6, "purged {purged}");
        let v4: i64 = one("SELECT shard_directory.complete_move('tenant', '1')");
        assert_eq!(changes(v0, 10_000), "false|");
        assert_eq!(changes(v3, 10_000), format!("true|tenant:1@{v4}"));
        let version_only: i64 = one(&format!(
            "SELECT version FROM shard_directory.changes_since({v0})"
        ));
        assert_eq!(version_only, v4);
    }

    /// History carried over from 0.1.0 has `version_at` = the transaction's start, out of
    /// version order: purging by time alone removed a later version and kept an earlier one,
    /// and `changes_since` then answered `complete` while missing the change. Purge removes a
    /// prefix of versions only, and `complete` holds only where history has every version.
    #[pg_test]
    fn purge_leaves_no_hole_and_complete_means_every_version_is_there() {
        setup();
        let v = version();
        for id in ["1", "2", "3"] {
            change(&format!(
                "UPDATE shard_directory.shard_directory \
                 SET region = CASE WHEN region IS NULL THEN 'eu' END WHERE entity_id = '{id}'"
            ));
        }
        // The middle version as an upgraded row: taken "long ago".
        let as_upgraded = |sql: &str| {
            Spi::run(&format!(
                "ALTER TABLE shard_directory.shard_directory_history \
                   DISABLE TRIGGER shard_directory_history_guard; {sql}; \
                 ALTER TABLE shard_directory.shard_directory_history \
                   ENABLE ALWAYS TRIGGER shard_directory_history_guard"
            ))
            .unwrap()
        };
        as_upgraded(&format!(
            "UPDATE shard_directory.shard_directory_history SET version_at = '2000-01-01' \
             WHERE version = {}",
            v + 2
        ));
        let purged: i64 = one("SELECT shard_directory.purge_history('2001-01-01')");
        assert_eq!(
            purged, 0,
            "versions before the middle one were taken after 2001"
        );
        let all = format!(
            "true|tenant:1@{} tenant:2@{} tenant:3@{}",
            v + 1,
            v + 2,
            v + 3
        );
        assert_eq!(changes(v, 10_000), all);
        // A hole (what the purge by time left) is not complete; past it, it is.
        as_upgraded(&format!(
            "DELETE FROM shard_directory.shard_directory_history WHERE version = {}",
            v + 2
        ));
        assert_eq!(changes(v, 10_000), "false|");
        assert_eq!(changes(v + 2, 10_000), format!("true|tenant:3@{}", v + 3));
        // A version bumped by hand has no history: no one can say what changed in it.
        Spi::run("UPDATE shard_directory.shard_directory_version SET version = version + 1")
            .unwrap();
        assert_eq!(changes(v + 3, 10_000), "false|");
    }

    /// Every router's watcher calls changes_since on every change, for the life of its session:
    /// it must read history through its indexes (and the version row at its place, or through
    /// its key). History grows until purged; an earlier version scanned all of it on every call. Counted with this
    /// transaction's own table statistics, over eight calls (the PL/pgSQL version it replaced
    /// changed plans after five).
    #[pg_test]
    fn changes_since_reads_history_and_the_version_through_their_indexes() {
        setup();
        Spi::run(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             SELECT 'tenant', 'bulk-' || i, 'shard_1' FROM generate_series(1, 2000) i",
        )
        .unwrap();
        let v: i64 = one("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')");
        // Scans of one kind (seq, idx) of both tables so far in this transaction.
        let scans = |kind: &str| -> i64 {
            one(&format!(
                "SELECT sum({kind}_scan)::bigint FROM pg_stat_xact_user_tables \
                 WHERE relname IN ('shard_directory_history', 'shard_directory_version')"
            ))
        };
        let before = (scans("seq"), scans("idx"));
        for _ in 0..8 {
            assert_eq!(changes(v - 1, 10_000), format!("true|tenant:1@{v}"));
        }
        let after = (scans("seq"), scans("idx"));
        assert_eq!(after.0, before.0, "sequential scans");
        assert!(
            after.1 >= before.1 + 8,
            "index scans: {before:?} -> {after:?}"
        );
    }

    /// The version row is looked for where the last bump wrote it (shared memory: this cluster
    /// preloads the library), without its key. A wrong place is never taken for the row: past
    /// the table's end, an older version of the row, a version whose bump was rolled back. The
    /// next bump still moves the committed version by one, and changes_since reads it.
    #[pg_test]
    fn a_wrong_place_for_the_version_row_is_never_taken_for_it() {
        use crate::directory::latest;
        setup();
        let stored =
            || -> i64 { one("SELECT version FROM shard_directory.shard_directory_version") };
        let read = || -> i64 { one("SELECT version FROM shard_directory.changes_since(0)") };
        let key_scans = || -> i64 {
            one("SELECT idx_scan FROM pg_stat_xact_user_tables \
                 WHERE relname = 'shard_directory_version'")
        };

        const CHANGE: &str = "UPDATE shard_directory.shard_directory \
             SET region = CASE WHEN region IS NULL THEN 'eu' END WHERE entity_id = '3'";
        let change_three = || change(CHANGE);

        // Right: neither the bump nor the read looks the row up by its key.
        let older = latest::row().expect("a bump records where it wrote the row");
        let (v, scans) = (stored(), key_scans());
        change_three();
        assert_eq!((stored(), read()), (v + 1, v + 1));
        assert_eq!(key_scans(), scans, "the row read at its place");

        let past_end = pg_sys::ItemPointerData {
            ip_blkid: pg_sys::BlockIdData {
                bi_hi: 0,
                bi_lo: 1000,
            },
            ip_posid: 1,
        };
        for (wrong, place) in [(older, "an older version"), (past_end, "past the end")] {
            latest::set_row(wrong);
            let (v, scans) = (stored(), key_scans());
            assert_eq!(read(), v, "read with the place at {place}");
            change_three();
            assert_eq!(
                (stored(), read()),
                (v + 1, v + 1),
                "bump with the place at {place}"
            );
            assert!(key_scans() > scans, "the key used instead of {place}");
        }

        // A bump rolled back leaves its place behind: its row version is not the row.
        let place = || latest::row().map(|t| (t.ip_blkid.bi_hi, t.ip_blkid.bi_lo, t.ip_posid));
        let (v, committed) = (stored(), place());
        // A move step takes its version at once: the division fails after it.
        refusal("SELECT shard_directory.freeze('tenant', '3'); SELECT 1 / 0");
        assert_ne!(place(), committed, "the place of the version rolled back");
        assert_eq!((stored(), read()), (v, v), "after a bump rolled back");
        change_three();
        assert_eq!((stored(), read()), (v + 1, v + 1), "the bump after it");
    }

    /// A statement expects its version from shared memory (this cluster preloads the library).
    /// An expectation too high (a bump rolled back) or too low (another writer bumped since)
    /// only makes the statement stamp its rows again: they and their history carry the version
    /// it got, and the expectation is right again after.
    #[pg_test]
    fn a_wrong_expected_version_costs_a_second_stamp_never_a_wrong_one() {
        use crate::directory::latest;
        setup();
        assert_eq!(latest::get(), Some(version()), "a bump records its version");
        let updates = || -> i64 {
            one("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'shard_directory'")
        };
        for off_by in [5, -1] {
            let (v, updated) = (version(), updates());
            latest::set(v + off_by);
            change(
                "UPDATE shard_directory.shard_directory \
                 SET region = CASE WHEN region IS NULL THEN 'eu' END WHERE entity_type = 'tenant'",
            );
            let got = v + 1;
            assert_eq!(version(), got);
            let stamped = |table: &str| -> i64 {
                one(&format!(
                    "SELECT count(*) FROM shard_directory.{table} WHERE version = {got}"
                ))
            };
            assert_eq!(
                (
                    stamped("shard_directory"),
                    stamped("shard_directory_history")
                ),
                (3, 3)
            );
            assert_eq!(
                updates() - updated,
                6,
                "three rows written, then stamped again"
            );
            assert_eq!(latest::get(), Some(got));
        }
    }

    /// A statement whose row or closing triggers would not run is refused before it changes
    /// anything: its rows would be stamped, but never versioned, recorded or notified.
    #[pg_test]
    fn a_change_is_refused_while_a_trigger_it_needs_would_not_run() {
        setup();
        let update =
            "UPDATE shard_directory.shard_directory SET region = NULL WHERE entity_id = '1'";
        for (trigger, disable, enable) in [
            ("shard_directory_guard", "DISABLE", "ENABLE"),
            ("shard_directory_history", "DISABLE", "ENABLE"),
            ("shard_directory_changed", "DISABLE", "ENABLE"),
            // Fires only when session_replication_role = replica: not in this session.
            ("shard_directory_history", "ENABLE REPLICA", "ENABLE"),
        ] {
            let alter = |how: &str| {
                Spi::run(&format!(
                    "ALTER TABLE shard_directory.shard_directory {how} TRIGGER {trigger}"
                ))
                .unwrap()
            };
            alter(disable);
            let r = assert_refused(
                update,
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                &[trigger, "dropped or disabled"],
            );
            assert!(r
                .hint
                .unwrap_or_default()
                .contains("Re-enable the triggers"));
            alter(enable);
        }
        let v = version();
        change(update);
        assert_eq!(
            version(),
            v + 1,
            "with every trigger back, the change is made"
        );
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

    /// A move record of tenant 1, `phase`, whose freeze lease ends `lease` from now.
    fn move_record(phase: &str, lease: &str) -> i64 {
        one(&format!(
            "INSERT INTO shard_directory.shard_moves (entity_type, entity_id, source_shard, \
                 target_shard, method, phase, max_freeze, source_fence, target_fence, freeze_lease_until) \
             VALUES ('tenant', '1', 'shard_1', 'shard_2', 'copy', '{phase}', '10s', \
                     '{{\"state\":\"none\"}}', '{{\"state\":\"none\"}}', clock_timestamp() + '{lease}') \
             RETURNING move_id"
        ))
    }

    #[pg_test]
    fn a_freeze_whose_lease_ended_before_its_cutover_is_released_and_no_other() {
        setup();
        Spi::run(
            "SELECT shard_directory.begin_move('tenant', '1', 'shard_2'); \
             SELECT shard_directory.freeze('tenant', '1')",
        )
        .unwrap();
        let frozen = entry("1");
        let release = "SELECT shard_directory.release_expired_freeze('tenant', '1')";
        let id = move_record("verified", "1 hour");
        assert_eq!(
            Spi::get_one::<i64>(release).unwrap(),
            None,
            "the lease runs"
        );
        assert_eq!(entry("1"), frozen);
        Spi::run_with_args(
            "UPDATE shard_directory.shard_moves SET freeze_lease_until = clock_timestamp() - interval '1 ms', \
             phase = 'cutover' WHERE move_id = $1",
            &[id.into()],
        )
        .unwrap();
        assert_eq!(
            Spi::get_one::<i64>(release).unwrap(),
            None,
            "past its cutover"
        );
        Spi::run_with_args(
            "UPDATE shard_directory.shard_moves SET phase = 'frozen' WHERE move_id = $1",
            &[id.into()],
        )
        .unwrap();
        let v: i64 = one(release);
        assert_eq!(entry("1"), format!("active|shard_1|-|{v}"));
        assert_eq!(
            one::<String>(&format!(
                "SELECT phase || ': ' || last_error FROM shard_directory.shard_moves WHERE move_id = {id}"
            ))
            .split(" ended at ")
            .next(),
            Some("aborting: the freeze's lease")
        );
        assert_eq!(Spi::get_one::<i64>(release).unwrap(), None, "released once");
        // Routers may be granted it; they need nothing else.
        Spi::run(
            "CREATE ROLE sd_router; GRANT USAGE ON SCHEMA shard_directory TO sd_router; \
             SET LOCAL ROLE sd_router",
        )
        .unwrap();
        assert_eq!(refusal(release).code, ERRCODE_INSUFFICIENT_PRIVILEGE);
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
        change(
            "UPDATE shard_directory.shard_directory SET shard_name = 'shard_2' WHERE entity_id = '1'",
        );
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
        change("UPDATE shard_directory.shard_directory SET region = NULL WHERE entity_id = '2'");
        change("DELETE FROM shard_directory.shard_directory WHERE entity_id = '2'");
        let deleted_at = version();
        let rows: String = one(
            "SELECT string_agg(concat_ws(',', op, old_shard, old_state, new_shard, new_state, old_region, new_region, version), ' ' ORDER BY history_id) \
             FROM shard_directory.shard_directory_history WHERE entity_id = '2'",
        );
        assert_eq!(
            rows,
            format!("insert,shard_1,active,eu,1 update,shard_1,active,shard_1,active,eu,2 delete,shard_1,active,{deleted_at}")
        );
        // even a role that was granted every privilege on history cannot rewrite it
        Spi::run(
            "CREATE ROLE sd_forger; GRANT USAGE ON SCHEMA shard_directory TO sd_forger; \
             GRANT ALL ON shard_directory.shard_directory_history TO sd_forger; \
             SET LOCAL ROLE sd_forger",
        )
        .unwrap();
        for sql in [
            "UPDATE shard_directory.shard_directory_history SET new_shard = 'x'",
            "DELETE FROM shard_directory.shard_directory_history",
            "INSERT INTO shard_directory.shard_directory_history (op, transition, entity_type, entity_id, version, version_at) \
             OVERRIDING SYSTEM VALUE VALUES ('insert', 'insert', 'tenant', 'forged', 1, now())",
        ] {
            assert_eq!(refusal(sql).code, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "{sql}");
        }
        Spi::run("RESET ROLE").unwrap();
        let purged: i64 = one("SELECT shard_directory.purge_history(now() + interval '1 second')");
        assert_eq!(purged, 5);
    }

    #[pg_test]
    fn history_rows_get_what_their_column_defaults_give_and_an_index_they_cannot_keep_is_refused() {
        setup();
        change("UPDATE shard_directory.shard_directory SET region = NULL WHERE entity_id = '2'");
        let filled: bool = one(
            "SELECT history_id = (SELECT max(history_id) FROM shard_directory.shard_directory_history) \
                    AND txid = txid_current() AND changed_at = now() AND changed_by = current_user \
                    AND version = (SELECT version FROM shard_directory.shard_directory_version) \
             FROM shard_directory.shard_directory_history WHERE entity_id = '2' \
             ORDER BY version DESC LIMIT 1",
        );
        assert!(filled);
        // History is written without the executor, which an expression index would need.
        Spi::run("CREATE INDEX ON shard_directory.shard_directory_history (lower(entity_id))")
            .unwrap();
        let v = version();
        let sql = "UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = '2'";
        assert_eq!(refusal(sql).code, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE);
        assert_eq!(version(), v, "the refused change bumped nothing");
    }

    /// What a DBA adds to history is honoured by the extension's own writes of it: an added
    /// column gets its default (an added NOT NULL DEFAULT column made every change fail), an
    /// added CHECK refuses a change it does not accept (23514, naming it), and a generated
    /// column, which these writes cannot compute, is refused naming it.
    #[pg_test]
    fn history_rows_honour_the_columns_and_checks_a_dba_added() {
        setup();
        Spi::run(
            "ALTER TABLE shard_directory.shard_directory_history \
               ADD COLUMN ticket text NOT NULL DEFAULT 'none', \
               ADD COLUMN weight integer DEFAULT 2 * 21, \
               ADD COLUMN note text",
        )
        .unwrap();
        change("UPDATE shard_directory.shard_directory SET region = NULL WHERE entity_id = '2'");
        let added: String = one(
            "SELECT concat_ws(':', ticket, weight, coalesce(note, '-')) \
             FROM shard_directory.shard_directory_history WHERE entity_id = '2' \
             ORDER BY version DESC LIMIT 1",
        );
        assert_eq!(added, "none:42:-");

        Spi::run(
            "ALTER TABLE shard_directory.shard_directory_history \
               ADD CONSTRAINT entries_are_kept CHECK (op <> 'delete')",
        )
        .unwrap();
        assert_refused(
            "DELETE FROM shard_directory.shard_directory WHERE entity_id = '2'",
            ERRCODE_CHECK_VIOLATION,
            &["shard_directory_history", "entries_are_kept"],
        );

        Spi::run(
            "ALTER TABLE shard_directory.shard_directory_history \
               DROP CONSTRAINT entries_are_kept, \
               ADD COLUMN shout text GENERATED ALWAYS AS (upper(op)) STORED",
        )
        .unwrap();
        assert_refused(
            "UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = '2'",
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            &["generated column \"shout\"", "shard_directory_history"],
        );
    }

    #[pg_test]
    fn the_version_only_moves_forward() {
        setup();
        let v = version();
        for sql in [
            "UPDATE shard_directory.shard_directory_version SET version = 0",
            "UPDATE shard_directory.shard_directory_version SET version = version + 2",
            "UPDATE shard_directory.shard_directory_version SET version = 9223372036854775807",
            "DELETE FROM shard_directory.shard_directory_version",
        ] {
            assert_eq!(
                refusal(sql).code,
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "{sql}"
            );
        }
        // exactly the bump the trigger makes is the one direct write allowed
        Spi::run("UPDATE shard_directory.shard_directory_version SET version = version + 1")
            .unwrap();
        assert_eq!(version(), v + 1);
        // the owner restoring a dump raises it, never lowers it; nobody else inserts
        Spi::run(
            "INSERT INTO shard_directory.shard_directory_version (id, version) VALUES (true, 0)",
        )
        .unwrap();
        assert_eq!(version(), v + 1);
        Spi::run(
            "INSERT INTO shard_directory.shard_directory_version (id, version) VALUES (true, 40)",
        )
        .unwrap();
        assert_eq!(version(), 40);
        Spi::run(
            "CREATE ROLE sd_inserter; GRANT USAGE ON SCHEMA shard_directory TO sd_inserter; \
             GRANT ALL ON shard_directory.shard_directory_version TO sd_inserter; SET LOCAL ROLE sd_inserter",
        )
        .unwrap();
        assert_eq!(
            refusal(
                "INSERT INTO shard_directory.shard_directory_version (id, version) VALUES (true, 50)"
            )
            .code,
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
    }

    /// Reading the version writes nothing: no transaction id is taken (so it also answers on a
    /// hot standby). Read with SPI's read-only path: `Spi::get_one` would take one itself.
    #[pg_test]
    fn reading_the_version_takes_no_transaction_id() {
        let read = |sql: &str| {
            Spi::connect(|c| c.select(sql, Some(1), &[])?.first().get_one::<bool>())
                .expect("SPI")
                .expect("a value")
        };
        assert!(read("SELECT shard_directory.current_version() >= 0"));
        assert!(read("SELECT pg_current_xact_id_if_assigned() IS NULL"));
    }

    /// The epoch names a history: the cluster's system identifier and the lineage the first
    /// change this server made minted. A change made by another server (a restart, a promoted
    /// standby, a restored copy: here, the row says another server minted it) mints a new one,
    /// so versions numbered again after it are of another epoch; until then a copy is the state
    /// it was copied at. Before any change since the lineage existed, the timeline stands in.
    #[pg_test]
    fn the_epoch_is_the_system_identifier_and_a_lineage_each_server_renews_at_its_first_change() {
        let epoch = || one::<String>("SELECT shard_directory.directory_epoch()");
        let system = one::<String>("SELECT system_identifier::text FROM pg_control_system()");
        let lineage =
            || one::<String>("SELECT lineage FROM shard_directory.shard_directory_version");
        if lineage().is_empty() {
            assert_eq!(
                epoch(),
                one::<String>(
                    "SELECT s.system_identifier || '.' || c.timeline_id \
                     FROM pg_control_system() s, pg_control_checkpoint() c"
                )
            );
        }
        setup();
        let first = epoch();
        assert_eq!(first, format!("{system}.{}", lineage()));
        assert_eq!(lineage().len(), 16, "64 random bits: {first}");
        assert_eq!(
            one::<String>("SELECT lineage_minted_by FROM shard_directory.shard_directory_version"),
            one::<String>(
                "SELECT system_identifier || '.' || ((extract(epoch FROM pg_postmaster_start_time()) \
                 - 946684800) * 1000000)::bigint || '.' || d.oid \
                 FROM pg_control_system(), pg_database d WHERE d.datname = current_database()"
            ),
            "this server's start, in this database, minted it"
        );
        change("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')");
        assert_eq!(
            epoch(),
            first,
            "the same server goes on in the same lineage"
        );

        for step in [
            "ALTER TABLE shard_directory.shard_directory_version \
             DISABLE TRIGGER shard_directory_version_guard",
            "UPDATE shard_directory.shard_directory_version SET lineage_minted_by = 'another'",
            "ALTER TABLE shard_directory.shard_directory_version \
             ENABLE ALWAYS TRIGGER shard_directory_version_guard",
        ] {
            Spi::run(step).unwrap();
        }
        assert_eq!(epoch(), first, "a copy is its history until it changes");
        let before = version();
        change("SELECT shard_directory.abort_move('tenant', '1')");
        assert_eq!(version(), before + 1);
        let second = epoch();
        assert_ne!(second, first, "this server's first change mints a lineage");
        assert!(second.starts_with(&format!("{system}.")), "{second}");
        change("SELECT shard_directory.begin_move('tenant', '2', 'shard_2')");
        assert_eq!(epoch(), second);
    }

    #[pg_test]
    fn a_shard_region_change_is_checked_against_its_entries() {
        setup();
        assert_refused(
            "UPDATE shard_directory.shards SET region = 'us' WHERE shard_name = 'shard_1'",
            ERRCODE_CHECK_VIOLATION,
            &["tenant/1", "shard_1", "us"],
        );
        // entries without a region, or none placed there: allowed
        Spi::run("UPDATE shard_directory.shards SET region = 'us' WHERE shard_name = 'shard_4'")
            .unwrap();
    }

    /// A shard named by an entry (as its shard or its target) or by an open move stays
    /// registered under its name (23503, naming what names it); one nothing names leaves.
    #[pg_test]
    fn a_shard_stays_registered_while_anything_names_it() {
        setup();
        change("SELECT shard_directory.begin_move('tenant', '3', 'shard_4')");
        for (sql, named_by) in [
            (
                "DELETE FROM shard_directory.shards WHERE shard_name = 'shard_1'",
                "tenant/1",
            ),
            (
                "UPDATE shard_directory.shards SET shard_name = 'shard_one' WHERE shard_name = 'shard_1'",
                "tenant/1",
            ),
            (
                "DELETE FROM shard_directory.shards WHERE shard_name = 'shard_4'",
                "tenant/3",
            ),
        ] {
            let r = assert_refused(sql, ERRCODE_FOREIGN_KEY_VIOLATION, &[named_by]);
            assert!(r.hint.unwrap_or_default().contains("Move its entries"));
        }
        // An open move names its shards; a finished one does not.
        change(
            "INSERT INTO shard_directory.shards (shard_name) VALUES ('shard_5'); \
             INSERT INTO shard_directory.shard_moves (entity_type, entity_id, source_shard, \
                 target_shard, method, max_freeze, source_fence, target_fence) \
             VALUES ('tenant', '9', 'shard_3', 'shard_5', 'copy', '10s', '{}', '{}')",
        );
        let r = assert_refused(
            "DELETE FROM shard_directory.shards WHERE shard_name = 'shard_5'",
            ERRCODE_FOREIGN_KEY_VIOLATION,
            &["move", "tenant/9"],
        );
        assert!(r.message.contains("shard_5"), "{}", r.message);
        change(
            "UPDATE shard_directory.shard_moves SET phase = 'aborted', finished_at = now(); \
             DELETE FROM shard_directory.shards WHERE shard_name IN ('shard_5', 'shard_3')",
        );
        let left: i64 = one("SELECT count(*) FROM shard_directory.shards");
        assert_eq!(left, 3);
    }

    #[pg_test]
    fn a_table_altered_by_hand_gets_a_sqlstate_not_a_panic() {
        setup();
        Spi::run(
            "ALTER TABLE shard_directory.shard_directory_version DISABLE TRIGGER USER; \
             DELETE FROM shard_directory.shard_directory_version; \
             ALTER TABLE shard_directory.shard_directory_version ENABLE TRIGGER USER",
        )
        .unwrap();
        for sql in [
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', '7', 'shard_1')",
            "SELECT shard_directory.current_version()",
        ] {
            let r = refusal(sql);
            assert_eq!(r.code, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "{}", r.message);
            assert!(r.message.contains("shard_directory_version"), "{}", r.message);
        }
    }
}
