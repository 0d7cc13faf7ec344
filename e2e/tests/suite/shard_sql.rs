//! The shard's check under what SQL can say, as an application role meets it: an INSERT that a
//! rule runs (its own temp table's, or a DBA's audit rule). Every write below of a moved or
//! frozen tenant's row is refused, and the server never restarts.

use shard_directory_e2e::Cluster;
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
