//! The shard role: the check and its settings, fences, `protect`, stats, entity keys.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::PgSqlErrorCode::*;

    use crate::pg_tests::helpers::*;

    #[pg_test]
    fn a_leased_freeze_ends_by_itself_and_then_admits_only_clients_past_the_freeze() {
        Spi::run(
            "CREATE TABLE orders (tenant_id int, item text); \
             SELECT shard_directory.protect('orders', 'tenant_id', 'tenant'); \
             SELECT shard_directory.fence_frozen('tenant', '7', interval '200 ms', 41)",
        )
        .unwrap();
        client("100");
        entity("7");
        assert_eq!(json(refusal(CHECK).detail)["reason"], "frozen");
        assert_eq!(
            refusal("TRUNCATE orders").code,
            ERRCODE_T_R_SERIALIZATION_FAILURE,
            "frozen while leased"
        );
        Spi::run("SELECT pg_sleep(0.25)").unwrap();
        client("41");
        let r = refusal("INSERT INTO orders VALUES (7, 'stale')");
        assert_eq!(
            (r.code, json(r.detail)["min_version"].as_i64()),
            (ERRCODE_T_R_SERIALIZATION_FAILURE, Some(42)),
            "{}",
            r.message
        );
        client("42");
        Spi::run(&format!(
            "{CHECK}; INSERT INTO orders VALUES (7, 'after the release')"
        ))
        .unwrap();
        Spi::run("TRUNCATE orders").unwrap();
        assert_eq!(
            refusal("SELECT shard_directory.fence_frozen('tenant', '7', NULL, 41)").code,
            ERRCODE_NULL_VALUE_NOT_ALLOWED
        );
    }

    /// The cutover's fence refuses reads too, not only writes, and after its lease admits only
    /// clients at the cutover's version (or an abort's, which comes later).
    #[pg_test]
    fn a_cutover_fence_refuses_reads_too_and_then_admits_only_clients_at_the_cutover() {
        Spi::run(
            "CREATE TABLE orders (tenant_id int, item text); \
             SELECT shard_directory.protect('orders', 'tenant_id', 'tenant'); \
             SELECT shard_directory.fence_cutover('tenant', '7', interval '200 ms', 45)",
        )
        .unwrap();
        client("44");
        entity("7");
        let read = "SELECT shard_directory.assert_directory_version(true)";
        assert_eq!(json(refusal(read).detail)["reason"], "frozen", "a read");
        assert_eq!(json(refusal(CHECK).detail)["reason"], "frozen", "a write");
        let state: Option<String> =
            Spi::get_one("SELECT state FROM shard_directory.shard_fences WHERE entity_id = '7'")
                .unwrap();
        assert_eq!(state.as_deref(), Some("cutover"));
        Spi::run("SELECT pg_sleep(0.25)").unwrap();
        let r = refusal(read);
        assert_eq!(
            (r.code, json(r.detail)["min_version"].as_i64()),
            (ERRCODE_T_R_SERIALIZATION_FAILURE, Some(45)),
            "a reader before the cutover, past the lease: {}",
            r.message
        );
        client("45");
        Spi::run(&format!(
            "{read}; {CHECK}; INSERT INTO orders VALUES (7, 'after')"
        ))
        .unwrap();
        assert_eq!(
            refusal("SELECT shard_directory.fence_cutover('tenant', '7', NULL, 45)").code,
            ERRCODE_NULL_VALUE_NOT_ALLOWED
        );
    }

    #[pg_test]
    fn a_fresh_version_is_accepted_and_a_stale_one_refused_with_the_guides_message() {
        Spi::run("SELECT shard_directory.raise_min_accepted(42)").unwrap();
        client("42");
        Spi::run(CHECK).unwrap();
        client("43");
        Spi::run(CHECK).unwrap();
        client("41");
        let r = refusal(CHECK);
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        assert_eq!(r.message, "stale shard directory (client 41, minimum 42)");
        let d = json(r.detail);
        assert_eq!(
            (
                d["reason"].as_str(),
                d["client_version"].as_i64(),
                d["min_accepted"].as_i64()
            ),
            (Some("stale"), Some(41), Some(42))
        );
    }

    /// A read is refused as a write is, for a stale version or a moved entity; a frozen entity
    /// is read (its rows are all still here until the cutover), and written to by no one.
    #[pg_test]
    fn the_check_for_reads_lets_a_frozen_entity_through_and_nothing_else() {
        const READ: &str = "SELECT shard_directory.assert_directory_version(true)";
        Spi::run("SELECT shard_directory.fence_frozen('tenant', '1')").unwrap();
        Spi::run("SELECT shard_directory.fence_moved('tenant', '2', 'shard_2', 42)").unwrap();
        Spi::run("SELECT shard_directory.fence_owned('tenant', '3', 42)").unwrap();
        client("41");
        entity("1");
        Spi::run(READ).unwrap();
        assert_eq!(json(refusal(CHECK).detail)["reason"], "frozen");
        assert_eq!(
            json(refusal("SELECT shard_directory.assert_directory_version(false)").detail)
                ["reason"],
            "frozen"
        );
        entity("2");
        let d = json(refusal(READ).detail);
        assert_eq!(
            (d["reason"].as_str(), d["moved_to"].as_str()),
            (Some("moved"), Some("shard_2"))
        );
        entity("3");
        assert_eq!(json(refusal(READ).detail)["reason"], "stale");
        client("42");
        Spi::run(READ).unwrap();
        Spi::run("SELECT shard_directory.raise_min_accepted(50)").unwrap();
        assert_eq!(json(refusal(READ).detail)["min_accepted"], 50);
        assert_eq!(
            refusal("SELECT shard_directory.assert_directory_version(NULL)").code,
            ERRCODE_NULL_VALUE_NOT_ALLOWED
        );
    }

    #[pg_test]
    fn bad_version_settings_each_get_their_documented_error() {
        // unset, and empty (what a transaction-local setting reads as after its transaction)
        let r = refusal(CHECK);
        assert_eq!(
            (r.code, r.message.as_str()),
            (
                ERRCODE_T_R_SERIALIZATION_FAILURE,
                "stale shard directory (client <NULL>, minimum 0)"
            )
        );
        assert_eq!(json(r.detail)["reason"], "missing");
        client("");
        assert_eq!(refusal(CHECK).code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        for bad in ["abc", "-1", "123456789012345678901234567890", "4.5"] {
            client(bad);
            let r = refusal(CHECK);
            assert_eq!(r.code, ERRCODE_INVALID_PARAMETER_VALUE, "{bad}");
            assert!(
                r.message.contains(&format!("\"{bad}\""))
                    && r.message.contains("app.directory_version"),
                "{}",
                r.message
            );
        }
        client("5");
        Spi::run("SELECT set_config('app.entity_type', 'tenant', true)").unwrap();
        assert_eq!(refusal(CHECK).code, ERRCODE_INVALID_PARAMETER_VALUE);
    }

    #[pg_test]
    fn raise_min_accepted_only_raises() {
        assert_eq!(
            one::<i64>("SELECT shard_directory.raise_min_accepted(10)"),
            10
        );
        for v in ["10", "9", "NULL"] {
            let r = refusal(&format!("SELECT shard_directory.raise_min_accepted({v})"));
            assert!(
                matches!(
                    r.code,
                    ERRCODE_INVALID_PARAMETER_VALUE | ERRCODE_NULL_VALUE_NOT_ALLOWED
                ),
                "{v}: {}",
                r.message
            );
        }
        assert_eq!(
            refusal("SELECT shard_directory.raise_min_accepted(9)").message,
            "raise_min_accepted(9) refused: min_accepted is already 10"
        );
        assert_eq!(
            refusal("UPDATE shard_directory.shard_settings SET min_accepted = 1").code,
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            refusal("DELETE FROM shard_directory.shard_settings").code,
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
        assert_eq!(
            one::<i64>("SELECT min_accepted FROM shard_directory.shard_settings"),
            10
        );
    }

    #[pg_test]
    fn fences_govern_their_entity_and_only_it() {
        // First, while this transaction holds no lock on the table: upgrading a lock
        // to TRUNCATE's could deadlock with the tests running beside this one.
        assert_eq!(
            refusal("TRUNCATE shard_directory.shard_fences").code,
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
        client("41");
        Spi::run("SELECT shard_directory.fence_frozen('tenant', '1')").unwrap();
        Spi::run("SELECT shard_directory.fence_moved('tenant', '2', 'shard_2', 42)").unwrap();
        Spi::run("SELECT shard_directory.fence_owned('tenant', '3', 42)").unwrap();

        entity("1");
        let r = refusal(CHECK);
        assert_eq!(
            (r.code, r.message.as_str()),
            (
                ERRCODE_T_R_SERIALIZATION_FAILURE,
                "tenant/1 is frozen on this shard while its cutover runs"
            )
        );
        assert_eq!(json(r.detail)["reason"], "frozen");

        entity("2");
        let r = refusal(CHECK);
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        let d = json(r.detail);
        assert_eq!(
            (
                d["reason"].as_str(),
                d["moved_to"].as_str(),
                d["version"].as_i64()
            ),
            (Some("moved"), Some("shard_2"), Some(42))
        );
        assert_eq!(
            (d["entity_type"].as_str(), d["entity_id"].as_str()),
            (Some("tenant"), Some("2"))
        );

        entity("3");
        let r = refusal(CHECK);
        assert_eq!(
            (r.code, r.message.as_str()),
            (
                ERRCODE_T_R_SERIALIZATION_FAILURE,
                "stale shard directory for tenant/3 (client 41, minimum 42)"
            )
        );
        client("42");
        Spi::run(CHECK).unwrap();

        // other tenants, and clients that declare no entity, are governed by min_accepted alone
        client("41");
        entity("4");
        Spi::run(CHECK).unwrap();
        Spi::run(
            "SELECT set_config('app.entity_type', '', true), set_config('app.entity_id', '', true)",
        )
        .unwrap();
        Spi::run(CHECK).unwrap();

        // a fence lifted is a fence gone
        Spi::run("SELECT shard_directory.unfence('tenant', '1')").unwrap();
        entity("1");
        Spi::run(CHECK).unwrap();
    }

    #[pg_test]
    fn protect_checks_every_write_without_the_application_calling_anything() {
        Spi::run(
            "CREATE TABLE orders (tenant_id int, item text); \
             SELECT shard_directory.protect('orders'); \
             SELECT shard_directory.protect('orders'); \
             SELECT shard_directory.raise_min_accepted(5)",
        )
        .unwrap();
        let triggers =
            || one::<i64>("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass");
        assert_eq!(triggers(), 1, "protecting twice is harmless");
        client("4");
        for sql in [
            "INSERT INTO orders VALUES (1, 'a')",
            "UPDATE orders SET item = 'b'",
            "DELETE FROM orders",
            "TRUNCATE orders",
        ] {
            assert_eq!(
                refusal(sql).code,
                ERRCODE_T_R_SERIALIZATION_FAILURE,
                "{sql}"
            );
        }
        client("5");
        Spi::run("INSERT INTO orders VALUES (1, 'a'), (2, 'b')").unwrap();

        // the row form: a multi-tenant statement touching a moved tenant's row is refused whole
        Spi::run("SELECT shard_directory.protect('orders', 'tenant_id', 'tenant')").unwrap();
        assert_eq!(triggers(), 2);
        Spi::run("SELECT shard_directory.fence_moved('tenant', '2', 'shard_2', 6)").unwrap();
        let r = refusal("UPDATE orders SET item = 'c'");
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        assert_eq!(json(r.detail)["moved_to"], "shard_2");
        assert_eq!(
            refusal("INSERT INTO orders VALUES (3, 'x'), (2, 'y')").code,
            ERRCODE_T_R_SERIALIZATION_FAILURE
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM orders WHERE item IN ('a', 'b')"),
            2
        );
        Spi::run("UPDATE orders SET item = 'c' WHERE tenant_id = 1").unwrap();

        assert_eq!(
            refusal("SELECT shard_directory.protect('orders', 'nope', 'tenant')").code,
            ERRCODE_UNDEFINED_COLUMN
        );
        assert_eq!(
            refusal("SELECT shard_directory.protect('no_such_table')").code,
            ERRCODE_UNDEFINED_TABLE
        );
        Spi::run("SELECT shard_directory.unprotect('orders')").unwrap();
        assert_eq!(triggers(), 0);
        client("1");
        Spi::run("DELETE FROM orders").unwrap();
    }

    #[pg_test]
    fn a_protect_trigger_whose_key_column_was_dropped_says_so() {
        Spi::run(
            "CREATE TABLE notes (tenant_id int, body text); \
             SELECT shard_directory.protect('notes', 'tenant_id', 'tenant'); \
             ALTER TABLE notes DROP COLUMN tenant_id",
        )
        .unwrap();
        client("1");
        let r = refusal("INSERT INTO notes VALUES ('hello')");
        assert_eq!(r.code, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE);
        assert!(
            r.message.contains("tenant_id") && r.hint.unwrap().contains("protect"),
            "{}",
            r.message
        );
    }

    #[pg_test]
    fn stats_count_checks_and_rejections_by_reason() {
        // The counts are shared by every backend (the library is preloaded) and other tests run
        // concurrently: holding the check's lock exclusively keeps their checks out of the count.
        Spi::run("LOCK TABLE shard_directory.shard_settings IN EXCLUSIVE MODE").unwrap();
        let count = |reason: &str| {
            Spi::get_one_with_args::<i64>(
                "SELECT count FROM shard_directory.stats() WHERE reason = $1",
                &[reason.into()],
            )
            .unwrap()
            .unwrap()
        };
        let (checks, stale, missing, invalid) = (
            count("checks"),
            count("stale"),
            count("missing"),
            count("invalid"),
        );
        refusal(CHECK);
        client("abc");
        refusal(CHECK);
        Spi::run("SELECT shard_directory.raise_min_accepted(3)").unwrap();
        client("2");
        refusal(CHECK);
        client("3");
        Spi::run(CHECK).unwrap();
        assert_eq!(
            (
                count("checks") - checks,
                count("stale") - stale,
                count("missing") - missing,
                count("invalid") - invalid
            ),
            (4, 1, 1, 1)
        );
    }

    #[pg_test]
    fn writes_made_straight_to_a_partition_are_checked_including_partitions_attached_later() {
        Spi::run(
            "CREATE TABLE parts (tenant_id int, body text) PARTITION BY LIST (tenant_id); \
             CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN (1, 2); \
             SELECT shard_directory.protect('parts', 'tenant_id', 'tenant'); \
             CREATE TABLE parts_b PARTITION OF parts FOR VALUES IN (3); \
             CREATE TABLE parts_c (tenant_id int, body text); \
             ALTER TABLE parts ATTACH PARTITION parts_c FOR VALUES IN (4); \
             CREATE TABLE plain_parts (tenant_id int) PARTITION BY LIST (tenant_id); \
             CREATE TABLE plain_parts_a PARTITION OF plain_parts FOR VALUES IN (1); \
             SELECT shard_directory.protect('plain_parts'); \
             SELECT shard_directory.raise_min_accepted(5); \
             SELECT shard_directory.fence_moved('tenant', '3', 'shard_2', 6)",
        )
        .unwrap();
        for sql in [
            "INSERT INTO parts_a VALUES (1, 'no version')",
            "INSERT INTO parts_b VALUES (3, 'no version')",
            "INSERT INTO parts_c VALUES (4, 'no version')",
            "INSERT INTO plain_parts_a VALUES (1)",
            "TRUNCATE parts_a",
            "TRUNCATE parts_b",
            "TRUNCATE parts_c",
        ] {
            assert_eq!(
                refusal(sql).code,
                ERRCODE_T_R_SERIALIZATION_FAILURE,
                "{sql}"
            );
        }
        client("5");
        Spi::run("INSERT INTO parts_a VALUES (1, 'ok'); INSERT INTO parts_c VALUES (4, 'ok'); INSERT INTO plain_parts_a VALUES (1)")
            .unwrap();
        let r = refusal("INSERT INTO parts_b VALUES (3, 'moved')");
        assert_eq!(json(r.detail)["moved_to"], "shard_2");
        // the mover sees the parent only
        assert_eq!(
            one::<String>(
                "SELECT string_agg(tbl::text, ',') FROM shard_directory.protected_tables()"
            ),
            "parts"
        );
        // each partition's row trigger is its own, none a clone of a partitioned table's (which
        // a parallel pg_restore could create while a partition's rows load)
        assert_eq!(
            one::<String>(
                "SELECT string_agg(format('%s %s', tgrelid::regclass, tgparentid = 0), ',' ORDER BY 1) \
                 FROM pg_trigger WHERE tgname = 'shard_directory_protect_row'"
            ),
            "parts_a t,parts_b t,parts_c t,plain_parts_a t"
        );
    }

    #[pg_test]
    fn truncate_is_refused_while_an_entity_of_the_table_is_frozen_or_moved() {
        Spi::run(
            "CREATE TABLE orders (tenant_id int, item text); \
             SELECT shard_directory.protect('orders', 'tenant_id', 'tenant'); \
             CREATE TABLE accounts (account_id int); \
             SELECT shard_directory.protect('accounts', 'account_id', 'account'); \
             SELECT shard_directory.fence_frozen('tenant', '7')",
        )
        .unwrap();
        client("1");
        Spi::run("INSERT INTO orders VALUES (1, 'a')").unwrap();
        let r = refusal("TRUNCATE orders");
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        assert!(
            r.message.contains("tenant/7") && r.message.contains("frozen"),
            "{}",
            r.message
        );
        Spi::run("TRUNCATE accounts").unwrap(); // another entity type: not concerned
        Spi::run("SELECT shard_directory.fence_moved('tenant', '7', 'shard_2', 3)").unwrap();
        assert!(refusal("TRUNCATE orders").message.contains("moved"));
        Spi::run("SELECT shard_directory.fence_owned('tenant', '7', 3); TRUNCATE orders").unwrap();
    }

    #[pg_test]
    fn the_row_check_sees_the_key_a_before_trigger_filled_in() {
        Spi::run(
            "CREATE TABLE events (tenant_id int, body text); \
             CREATE FUNCTION fill_tenant() RETURNS trigger LANGUAGE plpgsql AS \
               $$ BEGIN NEW.tenant_id := coalesce(NEW.tenant_id, 3); RETURN NEW; END $$; \
             CREATE TRIGGER zz_fill_tenant BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION fill_tenant(); \
             CREATE TABLE generated (n int, tenant_id int GENERATED ALWAYS AS (n + 1) STORED); \
             SELECT shard_directory.protect('events', 'tenant_id', 'tenant'); \
             SELECT shard_directory.protect('generated', 'tenant_id', 'tenant'); \
             SELECT shard_directory.fence_moved('tenant', '3', 'shard_2', 6)",
        )
        .unwrap();
        client("1");
        assert_eq!(
            json(refusal("INSERT INTO events (body) VALUES ('filled in later')").detail)
                ["entity_id"],
            "3"
        );
        assert_eq!(
            json(refusal("INSERT INTO generated (n) VALUES (2)").detail)["entity_id"],
            "3"
        );
        Spi::run("INSERT INTO events VALUES (1, 'fine'); INSERT INTO generated (n) VALUES (1)")
            .unwrap();
    }

    /// Calls of the protect trigger functions in this transaction so far.
    fn trigger_calls() -> i64 {
        calls_of("shard_directory_protect_%")
    }

    /// Calls of the extension's functions named like `pattern` in this transaction so far.
    fn calls_of(pattern: &str) -> i64 {
        Spi::get_one_with_args::<i64>(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_xact_user_functions \
             WHERE schemaname = 'shard_directory' AND funcname LIKE $1",
            &[pattern.into()],
        )
        .expect("SPI")
        .expect("a sum")
    }

    /// An INSERT with `ON CONFLICT DO NOTHING` inside a `WITH` query, for [`each_refused`].
    const ON_CONFLICT_IN_WITH: &str =
        "WITH w AS ({insert} ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) FROM w";

    /// `insert` with each of `rows`, in each of `forms` (where `{insert}` stands for it), is
    /// refused with 40001 and the rows' reason.
    fn each_refused(insert: &str, rows: &[(&str, &str)], forms: &[&str]) {
        for (values, reason) in rows {
            for form in forms {
                let sql = form.replace("{insert}", &format!("{insert} {values}"));
                let r = refusal(&sql);
                assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE, "{sql}");
                assert_eq!(json(r.detail)["reason"], *reason, "{sql}");
            }
        }
    }

    /// A plain INSERT is checked by the executor hook, not the triggers (`insert_check`), with
    /// the same verdicts; where the hook cannot see the row the trigger would, the triggers fire.
    #[pg_test]
    fn a_plain_insert_is_checked_without_calling_a_trigger_function() {
        Spi::run(
            "SET LOCAL track_functions = 'all'; \
             CREATE TABLE orders (id int GENERATED ALWAYS AS IDENTITY, tenant_id text, item text, \
               UNIQUE (tenant_id, item)); \
             SELECT shard_directory.protect('orders', 'tenant_id', 'tenant'); \
             SELECT shard_directory.fence_moved('tenant', 'gone', 'shard_2', 6); \
             SELECT shard_directory.raise_min_accepted(5)",
        )
        .unwrap();
        client("4");
        assert_eq!(
            refusal("INSERT INTO orders (tenant_id, item) VALUES ('a', 'x')").code,
            ERRCODE_T_R_SERIALIZATION_FAILURE
        );
        // EXPLAIN runs no check: it writes nothing.
        Spi::run("EXPLAIN INSERT INTO orders (tenant_id, item) VALUES ('a', 'x')").unwrap();
        client("5");
        let inserts = [
            "INSERT INTO orders (tenant_id, item) VALUES ('a', 'x')",
            "INSERT INTO orders (tenant_id, item) VALUES ('b', 'x'), ('c', 'x') RETURNING id",
            "INSERT INTO orders (tenant_id, item) SELECT 'd' || g, 'y' FROM generate_series(1, 50) g",
            "PREPARE ins AS INSERT INTO orders (tenant_id, item) VALUES ($1, $2); \
             EXECUTE ins('e', 'x'); EXECUTE ins('f', 'x')",
        ];
        let calls = trigger_calls();
        for sql in inserts {
            Spi::run(sql).unwrap();
        }
        assert_eq!(trigger_calls(), calls, "no trigger function was called");
        assert_eq!(one::<i64>("SELECT count(*) FROM orders"), 55);
        // a moved tenant's row anywhere in the statement refuses it whole, with the trigger's
        // verdict, from VALUES, from a query, from a function's INSERT
        for sql in [
            "INSERT INTO orders (tenant_id, item) VALUES ('g', 'x'), ('gone', 'x')",
            "INSERT INTO orders (tenant_id, item) SELECT t, 'z' FROM unnest(ARRAY['h', 'gone']) t",
            "DO $$ BEGIN INSERT INTO orders (tenant_id, item) VALUES ('gone', 'w'); END $$",
        ] {
            let r = refusal(sql);
            assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE, "{sql}");
            assert_eq!(json(r.detail)["moved_to"], "shard_2", "{sql}");
        }
        assert_eq!(trigger_calls(), calls);
        assert_eq!(one::<i64>("SELECT count(*) FROM orders"), 55);
        // a refusal caught in PL/pgSQL leaves the next INSERT checked as well
        Spi::run(
            "DO $$ BEGIN \
               FOR i IN 1..3 LOOP \
                 BEGIN INSERT INTO orders (tenant_id, item) VALUES ('gone', 'v' || i); \
                 EXCEPTION WHEN serialization_failure THEN \
                   INSERT INTO orders (tenant_id, item) VALUES ('k', 'v' || i); END; \
               END LOOP; END $$",
        )
        .unwrap();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM orders WHERE tenant_id = 'k'"),
            3
        );
        assert_eq!(trigger_calls(), calls);

        // ON CONFLICT: the executor checks every proposed row, one that conflicts too, so a
        // stale route does not learn "nothing inserted" from a shard its tenant left; and an
        // INSERT inside WITH as one on its own
        Spi::run("SELECT shard_directory.fence_frozen('tenant', 'a')").unwrap();
        each_refused(
            "INSERT INTO orders (tenant_id, item) VALUES",
            &[
                ("('gone', 'x')", "moved"),
                ("('a', 'x')", "frozen"),
                ("('g', 'x'), ('a', 'new')", "frozen"),
            ],
            &[
                "{insert} ON CONFLICT (tenant_id, item) DO NOTHING",
                "WITH w AS ({insert} RETURNING 1) SELECT count(*) FROM w",
                ON_CONFLICT_IN_WITH,
            ],
        );
        Spi::run("SELECT shard_directory.unfence('tenant', 'a')").unwrap();
        Spi::run(
            "INSERT INTO orders (tenant_id, item) VALUES ('a', 'x'), ('g', 'x') \
             ON CONFLICT (tenant_id, item) DO NOTHING; \
             WITH w AS (INSERT INTO orders (tenant_id, item) VALUES ('a', 'x'), ('h', 'x') \
               ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) FROM w",
        )
        .unwrap();
        assert_eq!(trigger_calls(), calls, "neither called a trigger");
        assert_eq!(one::<i64>("SELECT count(*) FROM orders"), 60);
        // the UPDATE of DO UPDATE is the row trigger's: it refuses a key changed to a moved one
        let r = refusal(
            "INSERT INTO orders (tenant_id, item) VALUES ('a', 'x') \
             ON CONFLICT (tenant_id, item) DO UPDATE SET tenant_id = 'gone'",
        );
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        assert_eq!(json(r.detail)["moved_to"], "shard_2");
        // and the request, checked by the executor, is not checked again for the UPDATE
        let upsert = "INSERT INTO orders (tenant_id, item) VALUES ('a', 'x') \
                      ON CONFLICT (tenant_id, item) DO UPDATE SET item = 'x2'";
        client("1");
        assert_eq!(refusal(upsert).code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        client("5");
        let (statement, row) = (
            "shard_directory_protect_statement",
            "shard_directory_protect_row",
        );
        let (statements, rows) = (calls_of(statement), calls_of(row));
        Spi::run(upsert).unwrap();
        assert_eq!(calls_of(statement), statements);
        assert_eq!(
            calls_of(row),
            rows + 1,
            "the row trigger checked the UPDATE"
        );
        assert_eq!(one::<i64>("SELECT count(*) FROM orders"), 60);

        // a trigger that would not fire checks nothing either: disabled, or enabled on origin
        // only in a session that replays changes
        Spi::run("ALTER TABLE orders DISABLE TRIGGER shard_directory_protect_row").unwrap();
        client("1");
        assert_eq!(
            refusal("INSERT INTO orders (tenant_id, item) VALUES ('m', 'x')").code,
            ERRCODE_T_R_SERIALIZATION_FAILURE,
            "the statement trigger still checks the version"
        );
        client("5");
        Spi::run("INSERT INTO orders (tenant_id, item) VALUES ('gone', 'unchecked')").unwrap();
        client("1");
        Spi::run(
            "ALTER TABLE orders ENABLE TRIGGER shard_directory_protect_row; \
             SET LOCAL session_replication_role = replica; \
             INSERT INTO orders (tenant_id, item) VALUES ('gone', 'replayed'); \
             SET LOCAL session_replication_role = origin",
        )
        .unwrap();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM orders WHERE tenant_id = 'gone'"),
            2
        );
    }

    /// An INSERT into a partitioned table: the executor checks the request and every proposed
    /// row, a conflicting one of `ON CONFLICT` too; the partitions' row triggers still check each
    /// row written, with the key a BEFORE ROW trigger set.
    #[pg_test]
    fn a_partitioned_tables_proposed_rows_are_checked_conflicting_ones_too() {
        Spi::run(
            "SET LOCAL track_functions = 'all'; \
             CREATE TABLE parts (tenant_id int, item text, PRIMARY KEY (tenant_id, item)) \
               PARTITION BY LIST (tenant_id); \
             CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN (1, 2, 3); \
             CREATE TABLE parts_b PARTITION OF parts FOR VALUES IN (4, 5, 6); \
             SELECT shard_directory.protect('parts', 'tenant_id', 'tenant')",
        )
        .unwrap();
        client("1");
        Spi::run(
            "INSERT INTO parts VALUES (1, 'x'), (2, 'x'), (3, 'x'), (4, 'x'); \
             SELECT shard_directory.fence_frozen('tenant', '2'); \
             SELECT shard_directory.fence_moved('tenant', '3', 'shard_2', 6); \
             SELECT shard_directory.raise_min_accepted(5)",
        )
        .unwrap();
        let (statement, row) = (
            "shard_directory_protect_statement",
            "shard_directory_protect_row",
        );
        client("4");
        let r = refusal("INSERT INTO parts VALUES (1, 'x') ON CONFLICT DO NOTHING");
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        client("5");
        let (statements, rows) = (calls_of(statement), calls_of(row));
        Spi::run("INSERT INTO parts VALUES (1, 'y'), (5, 'y')").unwrap();
        assert_eq!(
            (calls_of(statement), calls_of(row)),
            (statements, rows + 2),
            "the executor checked the request, the partitions' row triggers each row written"
        );
        each_refused(
            "INSERT INTO parts VALUES",
            &[
                ("(2, 'x')", "frozen"),
                ("(3, 'x')", "moved"),
                ("(1, 'z'), (2, 'new')", "frozen"),
            ],
            &[
                "{insert} ON CONFLICT DO NOTHING",
                "{insert} ON CONFLICT (tenant_id, item) DO UPDATE SET item = 'w'",
                ON_CONFLICT_IN_WITH,
            ],
        );
        Spi::run("INSERT INTO parts VALUES (1, 'x'), (4, 'z') ON CONFLICT DO NOTHING").unwrap();
        // DO UPDATE: the request is not checked again; the partition's row trigger checks the
        // row it updates
        let (statements, rows) = (calls_of(statement), calls_of(row));
        Spi::run(
            "INSERT INTO parts VALUES (4, 'x') ON CONFLICT (tenant_id, item) \
             DO UPDATE SET item = 'x2'",
        )
        .unwrap();
        assert_eq!((calls_of(statement), calls_of(row)), (statements, rows + 1));
        // a BEFORE ROW trigger may change the key after the executor read it: the partition's
        // row trigger reads the key written
        Spi::run(
            "CREATE FUNCTION redirect() RETURNS trigger LANGUAGE plpgsql AS \
               $$ BEGIN IF NEW.item = 'redirect' THEN NEW.tenant_id := 3; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER redirect BEFORE INSERT ON parts FOR EACH ROW EXECUTE FUNCTION redirect()",
        )
        .unwrap();
        let r = refusal("INSERT INTO parts VALUES (1, 'redirect')");
        let detail = json(r.detail);
        assert_eq!(
            (&detail["entity_id"], &detail["reason"]),
            (&"3".into(), &"moved".into())
        );
        assert_eq!(
            one::<String>(
                "SELECT string_agg(format('%s%s', tenant_id, item), ',' ORDER BY tenant_id, item) \
                 FROM parts"
            ),
            "1x,1y,2x,3x,4x2,4z,5y"
        );
    }

    /// What the executor learned of a table (where its key is, of which type) follows the
    /// table's changes, and finds the key however the INSERT names or fills the columns.
    #[pg_test]
    fn the_executor_finds_the_key_through_the_tables_changes() {
        Spi::run(
            "SET LOCAL track_functions = 'all'; \
             CREATE TABLE shifting (note text, tenant_id int DEFAULT 7, body text); \
             SELECT shard_directory.protect('shifting', 'tenant_id', 'tenant'); \
             SELECT shard_directory.fence_moved('tenant', '7', 'shard_2', 6)",
        )
        .unwrap();
        client("6");
        let calls = trigger_calls();
        let moved = |sql: &str, id: &str| {
            let r = refusal(sql);
            assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE, "{sql}");
            assert_eq!(json(r.detail)["entity_id"], id, "{sql}");
        };
        Spi::run("INSERT INTO shifting VALUES ('a', 1, 'x')").unwrap();
        moved("INSERT INTO shifting VALUES ('a', 7, 'x')", "7");
        moved("INSERT INTO shifting (body, note) VALUES ('x', 'a')", "7");
        moved(
            "INSERT INTO shifting (body, tenant_id) VALUES ('x', 7)",
            "7",
        );
        // a dropped column before the key, then the key's type changed and a column added
        Spi::run("ALTER TABLE shifting DROP COLUMN note").unwrap();
        Spi::run("INSERT INTO shifting VALUES (2, 'x')").unwrap();
        moved("INSERT INTO shifting VALUES (7, 'x')", "7");
        Spi::run(
            "ALTER TABLE shifting ALTER tenant_id DROP DEFAULT, ALTER tenant_id TYPE text, \
             ADD COLUMN extra int; \
             SELECT shard_directory.fence_moved('tenant', 'seven', 'shard_2', 6)",
        )
        .unwrap();
        moved("INSERT INTO shifting VALUES ('seven', 'x', 1)", "seven");
        Spi::run("INSERT INTO shifting VALUES ('eight', 'x', 1)").unwrap();
        // through a view that PostgreSQL turns into an INSERT on the table
        Spi::run("CREATE VIEW shifting_view AS SELECT body, tenant_id FROM shifting").unwrap();
        moved("INSERT INTO shifting_view VALUES ('x', 'seven')", "seven");
        Spi::run("INSERT INTO shifting_view VALUES ('x', 'nine')").unwrap();
        assert_eq!(trigger_calls(), calls, "the executor checked them all");
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT string_agg(tenant_id, ',' ORDER BY tenant_id) FROM shifting"
            )
            .unwrap()
            .unwrap(),
            "1,2,eight,nine"
        );
    }

    /// The executor reads a row's key as the row trigger's type output does, for every key type
    /// `protect` accepts, and for keys stored compressed or out of line.
    #[pg_test]
    fn the_executor_reads_every_key_type_as_the_row_trigger_does() {
        Spi::run(
            "SET LOCAL track_functions = 'all'; \
             CREATE TYPE color AS ENUM ('red', 'blue'); \
             CREATE DOMAIN code AS text CHECK (VALUE ~ '^[a-z0-9]+$')",
        )
        .unwrap();
        let keys = [
            ("text", "'T1'", "T1"),
            ("varchar(10)", "'v1'", "v1"),
            ("char(8)", "'c1'", "c1"),
            ("smallint", "-7", "-7"),
            ("integer", "70000", "70000"),
            ("bigint", "9000000000", "9000000000"),
            ("numeric(12,0)", "123", "123"),
            (
                "uuid",
                "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            ),
            ("color", "'blue'", "blue"),
            ("code", "'abc9'", "abc9"),
            ("text COLLATE \"C\"", "'cc'", "cc"),
        ];
        for (i, (ty, _, id)) in keys.iter().enumerate() {
            Spi::run(&format!(
                "CREATE TABLE typed_{i} (k {ty}, n int); \
                 SELECT shard_directory.protect('typed_{i}', 'k', 'e{i}')"
            ))
            .unwrap();
            Spi::run_with_args(
                "SELECT shard_directory.fence_moved($1, $2, 'shard_2', 6)",
                &[format!("e{i}").into(), (*id).into()],
            )
            .unwrap();
        }
        client("6");
        let calls = trigger_calls();
        for (i, (ty, value, id)) in keys.iter().enumerate() {
            let r = refusal(&format!("INSERT INTO typed_{i} VALUES ({value}, 1)"));
            assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE, "{ty}");
            assert_eq!(json(r.detail)["entity_id"], *id, "{ty}");
            Spi::run(&format!("INSERT INTO typed_{i} VALUES (NULL, 2)")).unwrap();
        }
        Spi::run("INSERT INTO typed_0 VALUES ('T2', 1); INSERT INTO typed_7 VALUES (gen_random_uuid(), 1)")
            .unwrap();
        assert_eq!(trigger_calls(), calls, "the executor checked them all");

        // Keys of 10,000 characters read from a table: compressed in line, and out of line.
        Spi::run(
            "CREATE TABLE long_keys (k text, n int); \
             CREATE TABLE long_keys_outside (k text, n int); \
             ALTER TABLE long_keys_outside ALTER k SET STORAGE EXTERNAL; \
             INSERT INTO long_keys VALUES (repeat('x', 10000), 3); \
             INSERT INTO long_keys_outside VALUES (repeat('y', 10000), 3); \
             SELECT shard_directory.fence_moved('e0', repeat('x', 10000), 'shard_2', 6); \
             SELECT shard_directory.fence_moved('e0', repeat('y', 10000), 'shard_2', 6)",
        )
        .unwrap();
        assert_eq!(
            one::<String>("SELECT pg_column_compression(k) FROM long_keys"),
            "pglz"
        );
        for (source, letter) in [("long_keys", "x"), ("long_keys_outside", "y")] {
            let r = refusal(&format!("INSERT INTO typed_0 SELECT k, n FROM {source}"));
            assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE, "{source}");
            assert_eq!(
                json(r.detail)["entity_id"],
                letter.repeat(10_000),
                "{source}"
            );
        }
        assert_eq!(trigger_calls(), calls);
    }

    /// One heavyweight lock per entity exhausted the lock table.
    #[pg_test]
    fn one_transaction_writes_rows_of_100k_tenants() {
        Spi::run(
            "CREATE TABLE orders (tenant_id int, item text); \
             SELECT shard_directory.protect('orders', 'tenant_id', 'tenant'); \
             SELECT shard_directory.fence_owned('tenant', '5', 1)",
        )
        .unwrap();
        client("1");
        Spi::run("INSERT INTO orders SELECT g, 'x' FROM generate_series(1, 100000) g").unwrap();
        assert_eq!(
            one::<i64>("SELECT count(DISTINCT tenant_id) FROM orders"),
            100_000
        );
        let locks: i64 = one(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'",
        );
        assert_eq!(locks, 0);
    }

    #[pg_test]
    fn only_a_key_type_whose_equality_is_its_text_can_be_protected() {
        Spi::run(
            "CREATE EXTENSION IF NOT EXISTS citext; \
             CREATE TYPE color AS ENUM ('red', 'blue'); \
             CREATE DOMAIN code AS text CHECK (VALUE ~ '^[a-z0-9]+$'); \
             CREATE DOMAIN ci_code AS citext",
        )
        .unwrap();
        // Only ICU makes nondeterministic collations; a server built without it has none. (16
        // lists an ICU collation, `unicode`, either way: initdb imports `und-x-icu` only with ICU.)
        let icu: bool =
            one("SELECT EXISTS (SELECT FROM pg_collation WHERE collname = 'und-x-icu')");
        if icu {
            Spi::run(
                "CREATE COLLATION case_blind \
                 (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
            )
            .unwrap();
        }
        let types = [
            ("text", true),
            ("varchar(10)", true),
            ("char(8)", true),
            ("smallint", true),
            ("integer", true),
            ("bigint", true),
            ("numeric(12,0)", true),
            ("uuid", true),
            ("color", true),
            ("code", true),
            ("text COLLATE \"C\"", true),
            ("citext", false),
            ("ci_code", false),
            ("text COLLATE case_blind", false),
            ("numeric", false),
            ("numeric(10,2)", false),
            ("date", false),
            ("timestamptz", false),
            ("bytea", false),
            ("double precision", false),
            ("jsonb", false),
        ];
        let types = types
            .iter()
            .filter(|(ty, _)| icu || !ty.contains("case_blind"));
        for (i, (ty, accepted)) in types.enumerate() {
            Spi::run(&format!("CREATE TABLE keyed_{i} (k {ty})")).unwrap();
            let protect = format!("SELECT shard_directory.protect('keyed_{i}', 'k', 'tenant')");
            if *accepted {
                Spi::run(&protect).unwrap_or_else(|e| panic!("{ty}: {e}"));
                continue;
            }
            let r = refusal(&protect);
            assert_eq!(r.code, ERRCODE_FEATURE_NOT_SUPPORTED, "{ty}: {}", r.message);
            assert!(
                r.message.contains(&format!("keyed_{i}.k")) && r.hint.is_some(),
                "{ty}: {}",
                r.message
            );
            assert_eq!(
                one::<i64>(&format!(
                    "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'keyed_{i}'::regclass"
                )),
                0,
                "{ty}: a refused protect leaves no trigger"
            );
        }
        // A key column altered since to a type that cannot key an entity is refused at the write.
        Spi::run("ALTER TABLE keyed_0 ALTER COLUMN k TYPE citext").unwrap();
        client("1");
        assert_eq!(
            refusal("INSERT INTO keyed_0 VALUES ('a')").code,
            ERRCODE_FEATURE_NOT_SUPPORTED
        );
    }

    #[pg_test]
    fn a_char_n_key_finds_its_fence_without_its_padding() {
        Spi::run(
            "CREATE TABLE padded (k char(8), body text); \
             SELECT shard_directory.protect('padded', 'k', 'tenant'); \
             SELECT shard_directory.fence_moved('tenant', 'acme', 'shard_2', 6)",
        )
        .unwrap();
        client("6");
        let r = refusal("INSERT INTO padded VALUES ('acme', 'x')");
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE, "{}", r.message);
        assert_eq!(json(r.detail)["entity_id"], "acme");
        Spi::run("INSERT INTO padded VALUES ('acme2', 'y')").unwrap();
        assert_eq!(
            refusal("UPDATE padded SET k = 'acme' WHERE body = 'y'").code,
            ERRCODE_T_R_SERIALIZATION_FAILURE
        );
        assert_eq!(
            one::<String>("SELECT shard_directory.canonical_entity_id('padded', 'acme')"),
            "acme"
        );
        assert_eq!(
            one::<String>("SELECT shard_directory.canonical_entity_id('padded', 'acme   ')"),
            "acme"
        );
        assert_eq!(
            refusal("SELECT shard_directory.canonical_entity_id('padded', 'acmecorp1')").code,
            ERRCODE_STRING_DATA_RIGHT_TRUNCATION
        );
    }

    #[pg_test]
    fn a_fence_and_a_declared_id_must_be_canonical_for_the_key() {
        Spi::run(
            "CREATE TABLE by_number (k bigint); \
             SELECT shard_directory.protect('by_number', 'k', 'tenant'); \
             CREATE TABLE by_uuid (k uuid); \
             SELECT shard_directory.protect('by_uuid', 'k', 'account')",
        )
        .unwrap();
        let r = refusal("SELECT shard_directory.fence_moved('tenant', '08842', 'shard_2', 6)");
        assert_eq!(r.code, ERRCODE_INVALID_PARAMETER_VALUE);
        assert!(
            r.message.contains("\"08842\"")
                && r.message.contains("by_number.k")
                && r.message.contains("reads it as \"8842\""),
            "{}",
            r.message
        );
        let r = refusal("SELECT shard_directory.fence_frozen('tenant', 'abc')");
        assert_eq!(r.code, ERRCODE_INVALID_TEXT_REPRESENTATION, "{}", r.message);
        let upper = "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11";
        assert_eq!(
            refusal(&format!(
                "SELECT shard_directory.fence_frozen('account', '{upper}')"
            ))
            .code,
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM shard_directory.shard_fences"),
            0,
            "refused fences change nothing"
        );
        Spi::run(&format!(
            "SELECT shard_directory.fence_moved('tenant', '8842', 'shard_2', 6); \
             SELECT shard_directory.fence_frozen('account', '{}')",
            upper.to_lowercase()
        ))
        .unwrap();
        client("6");
        // The row's key is always canonical: 08842 is the row of 8842.
        assert_eq!(
            json(refusal("INSERT INTO by_number VALUES ('08842')").detail)["entity_id"],
            "8842"
        );
        assert_eq!(
            json(refusal(&format!("INSERT INTO by_uuid VALUES ('{upper}')")).detail)["reason"],
            "frozen"
        );
        // A declared id that would miss the fence is refused, not let through.
        entity("08842");
        assert_eq!(refusal(CHECK).code, ERRCODE_INVALID_PARAMETER_VALUE);
        entity("8842");
        assert_eq!(json(refusal(CHECK).detail)["reason"], "moved");
        entity("17");
        Spi::run(CHECK).unwrap();
        assert_eq!(
            one::<String>("SELECT shard_directory.canonical_entity_id('by_number', '007')"),
            "7"
        );
        assert_eq!(
            refusal("SELECT shard_directory.canonical_entity_id('padded_nowhere', '1')").code,
            ERRCODE_UNDEFINED_TABLE
        );
        Spi::run("CREATE TABLE unkeyed (k int); SELECT shard_directory.protect('unkeyed')")
            .unwrap();
        assert_eq!(
            refusal("SELECT shard_directory.canonical_entity_id('unkeyed', '1')").code,
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
    }
}
