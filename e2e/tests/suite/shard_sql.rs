//! The shard's check under what SQL can say, as an application role meets it: an INSERT that a
//! rule runs (its own temp table's, or a DBA's audit rule), partitions made inside `CREATE
//! SCHEMA` or by a session replaying as a replica, children made with `INHERITS`, and who may
//! read the check's counts. Every write below of a moved or frozen tenant's row is refused, and
//! the server never restarts.

use shard_directory_e2e::Cluster;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Error};

use crate::shard::retryable;

const PRELOAD: &[(&str, &str)] = &[("shared_preload_libraries", "shard_directory")];

/// A shard database made by `setup` (run as the superuser), and a session of the application
/// role `app` as docs/operations.md grants it: USAGE on the extension's schema, its table
/// privileges on every table of `public`, PUBLIC's TEMP, and a current directory version
/// stamped for its sessions. Tenant 8842 is then fenced moved, tenant 9 frozen.
async fn shard_with_app(cluster: &Cluster, setup: &str) -> (Client, Client) {
    cluster.create_database_with_extension("shard").await;
    let dba = cluster.connect("shard").await;
    dba.batch_execute(&format!(
        "CREATE ROLE app LOGIN; GRANT USAGE ON SCHEMA shard_directory TO app;
         ALTER ROLE app SET app.directory_version = '10';
         SET app.directory_version = '10';
         {setup};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO app;
         SELECT shard_directory.fence_moved('tenant', '8842', 'shard_2', 10);
         SELECT shard_directory.fence_frozen('tenant', '9');"
    ))
    .await
    .unwrap();
    let app = cluster.connect_as("shard", "app").await;
    (dba, app)
}

/// The refusal's reason (its DETAIL's `reason`), for a write that must be refused with 40001.
fn refused(result: Result<(), Error>) -> String {
    let e = result.expect_err("the write must be refused");
    retryable(&e).1["reason"]
        .as_str()
        .expect("a reason")
        .to_owned()
}

async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

/// The server has not restarted since `started`, and no backend died.
async fn still_up(cluster: &Cluster, started: &str) {
    let now = up_since(&cluster.connect("shard").await).await;
    assert_eq!(now, started, "the postmaster restarted");
    assert_eq!(cluster.crashes(), 0, "{}", cluster.server_log());
}

async fn up_since(c: &Client) -> String {
    c.query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .unwrap()
        .get(0)
}

/// PostgreSQL runs a rule's INSERT as a query that does not set the command's tag, and lists its
/// plan node twice: the check wrapped it twice and called itself until the stack overflowed,
/// taking every backend with it. Preloaded, and loaded by the session's first check.
#[tokio::test]
async fn an_insert_a_rule_runs_is_checked_once_and_crashes_nothing() {
    for settings in [PRELOAD, &[]] {
        let cluster = Cluster::start("shard-rule", settings);
        let (dba, app) = shard_with_app(
            &cluster,
            "CREATE TABLE orders (tenant_id text NOT NULL, item text NOT NULL);
             CREATE TABLE orders_log (tenant_id text NOT NULL, note text NOT NULL);
             SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');
             SELECT shard_directory.protect('orders_log', 'tenant_id', 'tenant');
             INSERT INTO orders VALUES ('7', 'book'), ('8842', 'pen')",
        )
        .await;
        let started = up_since(&dba).await;
        app.batch_execute("SELECT shard_directory.assert_directory_version()")
            .await
            .unwrap();
        // The application role's own temp table with a rule: an UPDATE that matches no row, then
        // one that does; an INSTEAD rule of another command.
        app.batch_execute(
            "CREATE TEMP TABLE t (tenant_id text);
             CREATE RULE t_log AS ON UPDATE TO t DO ALSO INSERT INTO orders_log VALUES (NEW.tenant_id, 'also');
             CREATE RULE t_del AS ON DELETE TO t DO INSTEAD INSERT INTO orders_log VALUES (OLD.tenant_id, 'instead');
             UPDATE t SET tenant_id = '7';
             INSERT INTO t VALUES ('7');
             UPDATE t SET tenant_id = '7';
             DELETE FROM t",
        )
        .await
        .unwrap();
        assert_eq!(count(&app, "SELECT count(*) FROM orders_log").await, 2);
        // Through the rule, a moved or frozen tenant's row is refused as anywhere.
        assert_eq!(
            refused(app.batch_execute("UPDATE t SET tenant_id = '8842'").await),
            "moved"
        );
        assert_eq!(
            refused(
                app.batch_execute(
                    "INSERT INTO t VALUES ('9'); DELETE FROM t WHERE tenant_id = '9'"
                )
                .await
            ),
            "frozen"
        );
        // A DBA's ordinary audit rule: every plain UPDATE of orders runs it.
        dba.batch_execute(
            "CREATE RULE audit AS ON UPDATE TO orders
                 DO ALSO INSERT INTO orders_log VALUES (NEW.tenant_id, 'updated')",
        )
        .await
        .unwrap();
        app.batch_execute("UPDATE orders SET item = 'books' WHERE tenant_id = '7'")
            .await
            .unwrap();
        assert_eq!(
            refused(
                app.batch_execute("UPDATE orders SET item = 'pens' WHERE tenant_id = '8842'")
                    .await
            ),
            "moved"
        );
        assert_eq!(count(&app, "SELECT count(*) FROM orders_log").await, 3);
        still_up(&cluster, &started).await;
    }
}

/// The triggers `protect` puts on `tbl`: the statement trigger and the row trigger.
async fn protect_triggers(c: &Client, tbl: &str) -> Vec<String> {
    c.query(
        "SELECT tgname::text FROM pg_trigger WHERE tgrelid = $1::text::regclass
         AND tgname LIKE 'shard_directory_protect%' ORDER BY 1",
        &[&tbl],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

const BOTH: [&str; 2] = ["shard_directory_protect", "shard_directory_protect_row"];

/// Each of `tables` (under `orders`) has both of protect's triggers; each statement is refused
/// with its reason; an UPDATE of tenant 7's rows through `orders` goes through, and the fenced
/// tenants' rows (`fenced` of them) are all still there.
async fn checked_under_orders(
    dba: &Client,
    app: &Client,
    tables: &[&str],
    refusals: &[(&str, &str)],
    fenced: i64,
) {
    for table in tables {
        assert_eq!(protect_triggers(dba, table).await, BOTH, "{table}");
    }
    for (sql, reason) in refusals {
        assert_eq!(refused(app.batch_execute(sql).await), *reason, "{sql}");
        app.batch_execute("RESET app.directory_version")
            .await
            .unwrap();
    }
    app.batch_execute("UPDATE orders SET item = 'books' WHERE tenant_id = '7'")
        .await
        .unwrap();
    assert_eq!(
        count(
            dba,
            "SELECT count(*) FROM orders WHERE tenant_id IN ('8842', '9') AND item <> 'x'"
        )
        .await,
        fenced
    );
}

/// A partition made by a `CREATE TABLE` inside `CREATE SCHEMA`, or in a session with
/// `session_replication_role = replica` (a restore, a logical apply), gets the triggers as any
/// other: the application role can neither change a moved tenant's rows there through the
/// parent nor write straight to it without a current version. (The next partition made the usual
/// way would have protected every partition found without triggers: these are the last ones.)
#[tokio::test]
async fn a_partition_made_inside_create_schema_or_as_a_replica_is_protected() {
    let cluster = Cluster::start("shard-partitions", &[]);
    let (dba, app) = shard_with_app(
        &cluster,
        "CREATE TABLE orders (tenant_id text NOT NULL, item text NOT NULL) PARTITION BY LIST (tenant_id);
         SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');
         CREATE TABLE orders_rest PARTITION OF orders DEFAULT;
         CREATE SCHEMA archive
             CREATE TABLE orders_8842 PARTITION OF public.orders FOR VALUES IN ('8842');
         SET session_replication_role = replica;
         CREATE TABLE orders_9 PARTITION OF orders FOR VALUES IN ('9');
         RESET session_replication_role;
         INSERT INTO orders VALUES ('8842', 'pen'), ('9', 'ink'), ('7', 'book');
         GRANT USAGE ON SCHEMA archive TO app;
         GRANT SELECT, INSERT, UPDATE, DELETE ON archive.orders_8842 TO app",
    )
    .await;
    checked_under_orders(
        &dba,
        &app,
        &["archive.orders_8842", "orders_9", "orders_rest"],
        &[
            ("UPDATE orders SET item = 'x' WHERE tenant_id = '8842'", "moved"),
            ("DELETE FROM orders WHERE tenant_id = '8842'", "moved"),
            ("DELETE FROM orders WHERE tenant_id = '9'", "frozen"),
            ("UPDATE archive.orders_8842 SET item = 'x'", "moved"),
            ("UPDATE orders_9 SET item = 'x'", "frozen"),
            (
                "SET app.directory_version = ''; INSERT INTO archive.orders_8842 VALUES ('8842', 'x')",
                "missing",
            ),
        ],
        2,
    )
    .await;
}

/// Children made with `INHERITS (orders)`, before `protect` or after it, or attached with `ALTER
/// TABLE ... INHERIT`: an UPDATE or DELETE of `orders` reaches their rows, and is checked there
/// as in `orders` itself.
#[tokio::test]
async fn the_children_of_a_protected_table_are_checked_as_the_table_is() {
    let cluster = Cluster::start("shard-inherits", &[]);
    let (dba, app) = shard_with_app(
        &cluster,
        "CREATE TABLE orders (tenant_id text NOT NULL, item text NOT NULL);
         CREATE TABLE orders_2025 () INHERITS (orders);
         SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');
         CREATE TABLE orders_2026 () INHERITS (orders);
         CREATE TABLE orders_old (tenant_id text NOT NULL, item text NOT NULL);
         ALTER TABLE orders_old INHERIT orders;
         INSERT INTO orders_2025 VALUES ('8842', 'pen'), ('7', 'book');
         INSERT INTO orders_2026 VALUES ('9', 'ink');
         INSERT INTO orders_old VALUES ('8842', 'old')",
    )
    .await;
    checked_under_orders(
        &dba,
        &app,
        &["orders_2025", "orders_2026", "orders_old"],
        &[
            (
                "UPDATE orders SET item = 'x' WHERE tenant_id = '8842'",
                "moved",
            ),
            ("DELETE FROM orders WHERE tenant_id = '8842'", "moved"),
            ("DELETE FROM orders WHERE tenant_id = '9'", "frozen"),
            ("DELETE FROM orders_old", "moved"),
            ("UPDATE orders_2026 SET item = 'x'", "frozen"),
        ],
        3,
    )
    .await;
    // The mover's list is unchanged: the table protect() was given.
    assert_eq!(
        count(
            &dba,
            "SELECT count(*) FROM shard_directory.protected_tables()"
        )
        .await,
        1
    );
}

/// A table under tables protected with different keys (`INHERITS (orders, accounts)`, orders
/// protected for tenants, accounts for accounts) is refused as it is made, as it is attached
/// with `ALTER TABLE ... INHERIT`, and by `protect` of a parent above it (42P16, naming the table
/// and both protections), and nothing is made: it would get one row trigger, with one key, and
/// the other parent's fences did not reach its rows (an UPDATE through `accounts` of a moved
/// account's row in the child went through).
#[tokio::test]
async fn a_table_under_two_keys_is_refused_as_it_is_made() {
    let cluster = Cluster::start("shard-two-keys", &[]);
    let (dba, _app) = shard_with_app(
        &cluster,
        "CREATE TABLE orders (tenant_id text NOT NULL, item text);
         SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');
         CREATE TABLE accounts (account_id int NOT NULL, balance int);
         SELECT shard_directory.protect('accounts', 'account_id', 'account');
         CREATE TABLE ledger (account_id int NOT NULL, balance int);
         CREATE TABLE billed (tenant_id text NOT NULL, item text, account_id int NOT NULL,
                              balance int);
         ALTER TABLE billed INHERIT orders",
    )
    .await;
    for sql in [
        "CREATE TABLE billed_orders (note text) INHERITS (orders, accounts)",
        "ALTER TABLE billed INHERIT accounts",
        "ALTER TABLE billed INHERIT ledger; \
         SELECT shard_directory.protect('ledger', 'account_id', 'account')",
    ] {
        let e = dba.batch_execute(sql).await.expect_err(sql);
        let db = e.as_db_error().expect("a server error");
        assert_eq!(
            db.code(),
            &SqlState::INVALID_TABLE_DEFINITION,
            "{sql}: {db}"
        );
        assert!(
            db.message().contains("table public.billed")
                && db.message().contains("(tenant by tenant_id)")
                && db.message().contains("(account by account_id)"),
            "{sql}: {db}"
        );
    }
    assert_eq!(
        count(
            &dba,
            "SELECT count(*) FROM pg_inherits WHERE inhrelid = 'billed'::regclass"
        )
        .await,
        1,
        "billed inherits orders alone"
    );
    assert_eq!(
        count(
            &dba,
            "SELECT count(*) FROM pg_class WHERE relname = 'billed_orders'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &dba,
            "SELECT count(*) FROM shard_directory.protected_tables()"
        )
        .await,
        2,
        "orders and accounts"
    );
}

/// `stats()` and `entity_stats()` name the busiest tenants and their rates: the application
/// role is refused them (42501), a monitoring role (a member of `pg_monitor`, with USAGE on the
/// schema) reads them, as docs/operations.md grants it.
#[tokio::test]
async fn the_checks_counts_are_for_monitoring_roles_only() {
    let cluster = Cluster::start("shard-stats-privileges", PRELOAD);
    let (dba, app) = shard_with_app(
        &cluster,
        "CREATE TABLE orders (tenant_id text NOT NULL, item text NOT NULL);
         SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');
         CREATE ROLE watcher LOGIN IN ROLE pg_monitor;
         GRANT USAGE ON SCHEMA shard_directory TO watcher",
    )
    .await;
    app.batch_execute("INSERT INTO orders VALUES ('7', 'book')")
        .await
        .unwrap();
    for sql in [
        "SELECT * FROM shard_directory.stats()",
        "SELECT * FROM shard_directory.entity_stats()",
    ] {
        let e = app.batch_execute(sql).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {e:?}"
        );
    }
    let watcher = cluster.connect_as("shard", "watcher").await;
    assert_eq!(
        count(
            &watcher,
            "SELECT count FROM shard_directory.stats() WHERE reason = 'checks'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &watcher,
            "SELECT transactions FROM shard_directory.entity_stats()"
        )
        .await,
        1
    );
    drop(dba);
}
