//! Who may do what: writers need no grant on the bookkeeping tables and cannot forge them, the
//! trigger functions cannot be borrowed, the check needs no grant, `allow_repoint` needs one.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::PgSqlErrorCode::*;

    use crate::pg_tests::helpers::*;

    /// A role with privileges on `shard_directory` alone, as docs/operations.md's "Roles and grants" gives it.
    fn as_writer() {
        Spi::run(
            "CREATE ROLE sd_writer; GRANT USAGE ON SCHEMA shard_directory TO sd_writer; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON shard_directory.shard_directory TO sd_writer; \
             SET LOCAL ROLE sd_writer",
        )
        .unwrap();
    }

    /// `sql` is refused with 40001 because its tenant is frozen.
    fn refused_as_frozen(sql: &str) {
        let r = refusal(sql);
        assert_eq!(
            r.code, ERRCODE_T_R_SERIALIZATION_FAILURE,
            "{sql}: {}",
            r.message
        );
        assert_eq!(json(r.detail)["reason"], "frozen", "{sql}");
    }

    /// A key-value test table's rows, `<tenant><k>=<v>` in order.
    fn kv_rows(table: &str) -> String {
        one(&format!(
            "SELECT string_agg(format('%s%s=%s', tenant_id, k, v), ',' ORDER BY tenant_id, k) \
             FROM {table}"
        ))
    }

    #[pg_test]
    fn a_writer_needs_no_grant_on_version_or_history_and_cannot_forge_them() {
        setup();
        as_writer();
        let v = version();
        change(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', '9', 'shard_2'); \
             UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = '9'; \
             SELECT shard_directory.begin_move('tenant', '9', 'shard_1'); \
             SELECT shard_directory.abort_move('tenant', '9'); \
             DELETE FROM shard_directory.shard_directory WHERE entity_id = '9'",
        );
        assert_eq!(version(), v + 5);
        for sql in [
            "UPDATE shard_directory.shard_directory_version SET version = 9223372036854775807",
            "INSERT INTO shard_directory.shard_directory_history (op, transition, entity_type, entity_id, version, version_at) \
             VALUES ('insert', 'insert', 'tenant', 'forged', 1, now())",
            "SELECT shard_directory.purge_history(now())",
            "SET shard_directory.allow_repoint = on",
            "SELECT shard_directory.raise_min_accepted(5)",
            "SELECT shard_directory.fence_frozen('tenant', '1')",
            "SELECT shard_directory.fence_owned('tenant', '1', 1)",
            "SELECT shard_directory.fence_moved('tenant', '1', 'shard_2', 1)",
            "SELECT shard_directory.unfence('tenant', '1')",
            "SELECT shard_directory.bypass_fence('tenant', '1')",
        ] {
            assert_eq!(refusal(sql).code, ERRCODE_INSUFFICIENT_PRIVILEGE, "{sql}");
        }
        Spi::run("RESET ROLE").unwrap();
        let by: String = one(
            "SELECT string_agg(DISTINCT changed_by, ',') FROM shard_directory.shard_directory_history \
             WHERE entity_id = '9'",
        );
        assert_eq!(
            by, "sd_writer",
            "history names the writer, not the owner acting for it"
        );
    }

    #[pg_test]
    fn trigger_functions_cannot_be_borrowed() {
        as_writer();
        Spi::run("CREATE TEMP TABLE mine (op text)").unwrap();
        for function in [
            "shard_directory_record_history",
            "shard_directory_guard",
            "shard_settings_guard",
            "shard_fences_changed",
            "shard_directory_protect_row",
        ] {
            let sql = format!(
                "CREATE TRIGGER t BEFORE INSERT ON mine FOR EACH ROW EXECUTE FUNCTION shard_directory.{function}()"
            );
            assert_eq!(refusal(&sql).code, ERRCODE_INSUFFICIENT_PRIVILEGE, "{sql}");
        }
        // even a role that may attach them (here the superuser) finds they refuse a foreign table
        Spi::run("RESET ROLE; CREATE TABLE stolen (id bool PRIMARY KEY, min_accepted bigint)")
            .unwrap();
        for (function, timing) in [
            ("shard_settings_guard", "BEFORE"),
            ("shard_directory_record_history", "AFTER"),
            ("shard_directory_history_guard", "BEFORE"),
            ("shard_directory_protect_row", "AFTER"),
        ] {
            Spi::run(&format!(
                "DROP TRIGGER IF EXISTS t ON stolen; CREATE TRIGGER t {timing} INSERT OR UPDATE ON stolen \
                 FOR EACH ROW EXECUTE FUNCTION shard_directory.{function}()"
            ))
            .unwrap();
            let r = refusal("INSERT INTO stolen VALUES (true, 1)");
            assert_eq!(
                r.code, ERRCODE_TRIGGERED_ACTION_EXCEPTION,
                "{function}: {}",
                r.message
            );
            assert!(r.message.contains("stolen"), "{}", r.message);
        }
    }

    #[pg_test]
    fn allow_repoint_needs_superuser_or_a_grant_of_set() {
        setup();
        as_writer();
        assert_eq!(
            refusal("SET LOCAL shard_directory.allow_repoint = on").code,
            ERRCODE_INSUFFICIENT_PRIVILEGE
        );
        Spi::run(
            "RESET ROLE; GRANT SET ON PARAMETER shard_directory.allow_repoint TO sd_writer; \
             SET LOCAL ROLE sd_writer; SET LOCAL shard_directory.allow_repoint = on; \
             UPDATE shard_directory.shard_directory SET shard_name = 'shard_2' WHERE entity_id = '1'",
        )
        .unwrap();
        assert!(entry("1").starts_with("active|shard_2|"));
    }

    /// An application role with privileges on its own table only.
    fn app_table(ddl: &str) {
        Spi::run(&format!(
            "CREATE ROLE sd_app; GRANT CREATE, USAGE ON SCHEMA public TO sd_app; \
             GRANT USAGE ON SCHEMA shard_directory TO sd_app; \
             GRANT EXECUTE ON FUNCTION shard_directory.protect(regclass, text, text), \
                                       shard_directory.protect(regclass) TO sd_app; \
             SET LOCAL ROLE sd_app; {ddl}"
        ))
        .unwrap();
    }

    #[pg_test]
    fn the_check_needs_no_grant_on_the_extensions_tables() {
        Spi::run("SELECT shard_directory.raise_min_accepted(5); SELECT shard_directory.fence_frozen('tenant', '2')")
            .unwrap();
        app_table(
            "CREATE TABLE public.items (tenant_id int, body text); \
             SELECT shard_directory.protect('public.items', 'tenant_id', 'tenant')",
        );
        client("5");
        entity("1");
        Spi::run(&format!(
            "{CHECK}; INSERT INTO public.items VALUES (1, 'a')"
        ))
        .unwrap();
        let r = refusal("INSERT INTO public.items VALUES (2, 'b')");
        assert_eq!(r.code, ERRCODE_T_R_SERIALIZATION_FAILURE, "{}", r.message);
        assert_eq!(json(r.detail)["reason"], "frozen");
        client("4");
        assert_eq!(refusal(CHECK).code, ERRCODE_T_R_SERIALIZATION_FAILURE);
        // a role holding INSERT alone, on a table it does not own: the executor's check
        // (`insert_check`) and the triggers' give it the same verdicts
        Spi::run(
            "RESET ROLE; CREATE ROLE sd_inserter; GRANT USAGE ON SCHEMA public TO sd_inserter; \
             GRANT INSERT ON public.items TO sd_inserter; SET LOCAL ROLE sd_inserter",
        )
        .unwrap();
        client("5");
        Spi::run(
            "INSERT INTO public.items VALUES (1, 'c'); \
             INSERT INTO public.items SELECT 1, 'd' FROM generate_series(1, 3); \
             INSERT INTO public.items VALUES (1, 'e') ON CONFLICT DO NOTHING; \
             WITH w AS (INSERT INTO public.items VALUES (1, 'w') RETURNING 1) SELECT count(*) FROM w",
        )
        .unwrap();
        for sql in [
            "INSERT INTO public.items VALUES (2, 'f')",
            "INSERT INTO public.items SELECT g, 'g' FROM generate_series(1, 2) g",
            "INSERT INTO public.items VALUES (2, 'h') ON CONFLICT DO NOTHING",
            "WITH w AS (INSERT INTO public.items VALUES (2, 'x') RETURNING 1) SELECT count(*) FROM w",
        ] {
            refused_as_frozen(sql);
        }
        client("4");
        assert_eq!(
            refusal("INSERT INTO public.items VALUES (1, 'i')").code,
            ERRCODE_T_R_SERIALIZATION_FAILURE
        );
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM public.items WHERE tenant_id = 2"),
            0
        );
        assert_eq!(one::<i64>("SELECT count(*) FROM public.items"), 7);
        // a role holding INSERT, SELECT and UPDATE: an upsert is checked by the executor for
        // every proposed row, conflicting or not, and the key its UPDATE writes by the trigger
        Spi::run(
            "SET LOCAL ROLE sd_app; \
             CREATE TABLE public.kv (tenant_id int, k text, v text, PRIMARY KEY (tenant_id, k)); \
             SELECT shard_directory.protect('public.kv', 'tenant_id', 'tenant')",
        )
        .unwrap();
        client("5");
        Spi::run(
            "RESET ROLE; INSERT INTO public.kv VALUES (1, 'a', 'x'), (3, 'a', 'z'); \
             SELECT shard_directory.fence_frozen('tenant', '3'); \
             CREATE ROLE sd_upserter; GRANT USAGE ON SCHEMA public TO sd_upserter; \
             GRANT INSERT, SELECT, UPDATE ON public.kv TO sd_upserter; SET LOCAL ROLE sd_upserter",
        )
        .unwrap();
        const UPSERT: &str = "ON CONFLICT (tenant_id, k) DO UPDATE SET v = excluded.v";
        Spi::run(&format!(
            "INSERT INTO public.kv VALUES (1, 'a', 'x2') {UPSERT}; \
             INSERT INTO public.kv VALUES (1, 'b', 'y') {UPSERT}"
        ))
        .unwrap();
        for sql in [
            format!("INSERT INTO public.kv VALUES (3, 'a', 'w') {UPSERT}"),
            format!("INSERT INTO public.kv VALUES (3, 'b', 'w') {UPSERT}"),
            // 3b does not exist: the unique index would otherwise refuse it first
            "INSERT INTO public.kv VALUES (1, 'b', 'v') \
             ON CONFLICT (tenant_id, k) DO UPDATE SET tenant_id = 3"
                .to_owned(),
        ] {
            refused_as_frozen(&sql);
        }
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(kv_rows("public.kv"), "1a=x2,1b=y,3a=z");
        // the same for a partitioned table keyed by text, whose proposed rows the executor
        // checks and whose partitions' row triggers check the rows written (the frozen tenant's
        // row is put in as a restore would, unchecked)
        Spi::run(
            "CREATE TABLE public.kvp (tenant_id text, k text, v text, PRIMARY KEY (tenant_id, k)) \
               PARTITION BY HASH (tenant_id); \
             CREATE TABLE public.kvp_0 PARTITION OF public.kvp FOR VALUES WITH (MODULUS 2, REMAINDER 0); \
             CREATE TABLE public.kvp_1 PARTITION OF public.kvp FOR VALUES WITH (MODULUS 2, REMAINDER 1); \
             SELECT shard_directory.protect('public.kvp', 'tenant_id', 'tenant'); \
             INSERT INTO public.kvp VALUES ('1', 'a', 'x'); \
             SET LOCAL session_replication_role = replica; \
             INSERT INTO public.kvp VALUES ('3', 'a', 'z'); \
             SET LOCAL session_replication_role = origin; \
             GRANT INSERT, SELECT, UPDATE ON public.kvp TO sd_upserter; SET LOCAL ROLE sd_upserter; \
             INSERT INTO public.kvp VALUES ('1', 'a', 'x2') \
               ON CONFLICT (tenant_id, k) DO UPDATE SET v = excluded.v",
        )
        .unwrap();
        for sql in [
            "INSERT INTO public.kvp VALUES ('3', 'a', 'w') ON CONFLICT DO NOTHING",
            "INSERT INTO public.kvp VALUES ('3', 'b', 'w') ON CONFLICT DO NOTHING",
        ] {
            refused_as_frozen(sql);
        }
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(kv_rows("public.kvp"), "1a=x2,3a=z");
        Spi::run("SET LOCAL ROLE sd_app").unwrap();
        // protecting needs TRIGGER on the table; reading the extension's tables needs nothing
        Spi::run(
            "RESET ROLE; CREATE TABLE public.not_yours (tenant_id int); SET LOCAL ROLE sd_app",
        )
        .unwrap();
        assert_eq!(
            refusal("SELECT shard_directory.protect('public.not_yours')").code,
            ERRCODE_INSUFFICIENT_PRIVILEGE
        );
        assert_eq!(
            refusal("SELECT shard_directory.unprotect('public.not_yours')").code,
            ERRCODE_INSUFFICIENT_PRIVILEGE
        );
        assert_eq!(
            refusal("SELECT * FROM shard_directory.shard_fences").code,
            ERRCODE_INSUFFICIENT_PRIVILEGE
        );
    }
}
