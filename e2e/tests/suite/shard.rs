//! The shard role across sessions: fences and raises wait for checked transactions in flight, a
//! write checked after a fence commits is refused (also in REPEATABLE READ), the guide's stale
//! v41 / move at v42 scenario on a protected table, and `stats()` and `entity_stats()` across
//! backends.

use std::time::Duration;

use serde_json::Value;
use shard_directory_e2e::{backend_pid as pid, blocked_on, eventually, Cluster, ANY_LOCK};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Error};

const DEADLINE: Duration = Duration::from_secs(10);
const PRELOAD: &[(&str, &str)] = &[("shared_preload_libraries", "shard_directory")];

async fn shard(cluster: &Cluster, db: &str) -> Client {
    cluster.create_database_with_extension(db).await;
    let c = cluster.connect(db).await;
    c.batch_execute(
        "CREATE TABLE orders (tenant_id text NOT NULL, item text NOT NULL);
         SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');",
    )
    .await
    .unwrap();
    c
}

/// Opens a transaction stamped as the client crate stamps it.
async fn begin(c: &Client, isolation: &str, version: i64, tenant: &str) {
    c.batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
        .await
        .unwrap();
    c.execute(
        "SELECT set_config('app.directory_version', $1, true), set_config('app.entity_type', 'tenant', true), \
         set_config('app.entity_id', $2, true)",
        &[&version.to_string(), &tenant],
    )
    .await
    .unwrap();
}

async fn insert(c: &Client, tenant: &str, item: &str) -> Result<u64, Error> {
    c.execute("INSERT INTO orders VALUES ($1, $2)", &[&tenant, &item])
        .await
}

/// One stamped write in its own transaction.
async fn write(c: &Client, version: i64, tenant: &str, item: &str) -> Result<(), Error> {
    begin(c, "READ COMMITTED", version, tenant).await;
    match insert(c, tenant, item).await {
        Ok(_) => c.batch_execute("COMMIT").await,
        Err(e) => {
            c.batch_execute("ROLLBACK").await.unwrap();
            Err(e)
        }
    }
}

pub(crate) fn retryable(e: &Error) -> (String, Value) {
    let db = e.as_db_error().expect("a database error");
    assert_eq!(
        db.code(),
        &SqlState::T_R_SERIALIZATION_FAILURE,
        "{}",
        db.message()
    );
    let detail = serde_json::from_str(db.detail().expect("DETAIL")).expect("DETAIL is JSON");
    (db.message().to_owned(), detail)
}

async fn count(c: &Client, tenant: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM orders WHERE tenant_id = $1",
        &[&tenant],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn a_fence_waits_for_checked_writes_in_flight_and_refuses_writes_checked_after_it() {
    let cluster = Cluster::start("shard-fence", &[]);
    let dba = shard(&cluster, "shard_1").await;
    let writer = cluster.connect("shard_1").await;
    let late_rr = cluster.connect("shard_1").await;
    let other = cluster.connect("shard_1").await;
    let fencer = cluster.connect("shard_1").await;
    let fencer_pid = pid(&fencer).await;

    // A checked write is open; a REPEATABLE READ transaction has taken its snapshot.
    begin(&writer, "READ COMMITTED", 41, "8842").await;
    insert(&writer, "8842", "in flight").await.unwrap();
    begin(&late_rr, "REPEATABLE READ", 41, "8842").await;
    late_rr
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap();

    let fence = tokio::spawn(async move {
        fencer
            .execute(
                "SELECT shard_directory.fence_moved('tenant', '8842', 'shard_2', 42)",
                &[],
            )
            .await
            .unwrap();
    });
    blocked_on(
        &dba,
        fencer_pid,
        ANY_LOCK,
        "the fence to wait for the checked write",
    )
    .await;
    assert!(!fence.is_finished());
    // A checked write that starts meanwhile, even another tenant's, queues behind the fence (one
    // lock orders every check against every fence; the wait is bounded, see below).
    let other_pid = pid(&other).await;
    let queued = tokio::spawn(async move { write(&other, 41, "7", "after the fence").await });
    blocked_on(&dba, other_pid, ANY_LOCK, "the next checked write to queue").await;

    writer.batch_execute("COMMIT").await.unwrap();
    tokio::time::timeout(DEADLINE, fence)
        .await
        .expect("fence completes")
        .unwrap();
    tokio::time::timeout(DEADLINE, queued)
        .await
        .expect("the queued write proceeds once the fence commits")
        .unwrap()
        .unwrap();

    // Checked after the fence committed: refused, with where the tenant went.
    let (message, detail) = retryable(&write(&writer, 41, "8842", "late").await.unwrap_err());
    assert_eq!(
        message,
        "tenant/8842 has moved to shard \"shard_2\" (directory version 42)"
    );
    assert_eq!(
        (detail["moved_to"].as_str(), detail["version"].as_i64()),
        (Some("shard_2"), Some(42))
    );
    // Also when the transaction's snapshot predates the fence.
    let err = insert(&late_rr, "8842", "late rr").await.unwrap_err();
    assert_eq!(retryable(&err).1["reason"], "moved");
    late_rr.batch_execute("ROLLBACK").await.unwrap();

    assert_eq!(
        count(&dba, "8842").await,
        1,
        "only the write checked before the fence landed"
    );
}

/// A fence behind an idle-in-transaction client gives up within
/// `shard_directory.fence_wait_timeout`, names the blocker, and the shard's writes resume.
#[tokio::test]
async fn a_fence_behind_an_idle_transaction_gives_up_and_names_the_blocker() {
    let cluster = Cluster::start("shard-fence-wait", &[]);
    let dba = shard(&cluster, "shard_1").await;
    let idle = cluster.connect("shard_1").await;
    let other = cluster.connect("shard_1").await;
    let idle_pid = pid(&idle).await;

    begin(&idle, "READ COMMITTED", 41, "7").await;
    insert(&idle, "7", "and then the client went quiet")
        .await
        .unwrap();
    eventually("the client to be idle in transaction", DEADLINE, || async {
        let row = dba
            .query_one(
                "SELECT state = 'idle in transaction' FROM pg_stat_activity WHERE pid = $1",
                &[&idle_pid],
            )
            .await
            .unwrap();
        row.get::<_, bool>(0).then_some(())
    })
    .await;

    let fencer = cluster.connect("shard_1").await;
    let fencer_pid = pid(&fencer).await;
    fencer
        .batch_execute("SET shard_directory.fence_wait_timeout = 1500")
        .await
        .unwrap();
    let fence = tokio::spawn(async move {
        fencer
            .execute("SELECT shard_directory.fence_frozen('tenant', '8842')", &[])
            .await
    });
    blocked_on(
        &dba,
        fencer_pid,
        ANY_LOCK,
        "the fence to wait for the idle transaction",
    )
    .await;
    // While it waits, new checked writes queue behind it...
    let other_pid = pid(&other).await;
    let queued = tokio::spawn(async move { write(&other, 41, "9", "queued").await });
    blocked_on(
        &dba,
        other_pid,
        ANY_LOCK,
        "a checked write to queue behind the fence",
    )
    .await;

    // ...for a bounded time: the fence gives up, naming the blocker.
    let err = tokio::time::timeout(DEADLINE, fence)
        .await
        .expect("the fence gives up by itself")
        .unwrap()
        .unwrap_err();
    let db = err.as_db_error().expect("a database error");
    assert_eq!(db.code(), &SqlState::LOCK_NOT_AVAILABLE, "{}", db.message());
    assert!(
        db.message()
            .contains(&format!("pid {idle_pid} (idle in transaction)"))
            && db.message().contains("fence change for tenant/8842")
            && db.message().contains("1500 ms"),
        "{}",
        db.message()
    );
    assert!(db
        .hint()
        .unwrap_or_default()
        .contains("pg_terminate_backend"));
    // The write that queued behind it was not lost: it goes through once the fence gives up.
    tokio::time::timeout(DEADLINE, queued)
        .await
        .expect("the queued write proceeds")
        .unwrap()
        .unwrap();
    idle.batch_execute("COMMIT").await.unwrap();
    dba.execute("SELECT shard_directory.fence_frozen('tenant', '8842')", &[])
        .await
        .expect("with nothing in flight the fence goes through");
}

/// A fence on tenant 8842 that waits 500 ms for a checked transaction in flight and gives up
/// (55P03); its error, which names what it waited for.
async fn fence_gives_up(dba: &Client) -> tokio_postgres::error::DbError {
    dba.batch_execute("SET shard_directory.fence_wait_timeout = 500")
        .await
        .unwrap();
    let err = dba
        .execute("SELECT shard_directory.fence_frozen('tenant', '8842')", &[])
        .await
        .expect_err("the fence must wait for the checked transaction");
    let db = err.as_db_error().expect("a database error").clone();
    assert_eq!(db.code(), &SqlState::LOCK_NOT_AVAILABLE, "{}", db.message());
    db
}

/// A check remembers that its transaction holds the lock; a rolled-back savepoint releases the
/// lock it took, and the next check of the transaction must take it again.
#[tokio::test]
async fn a_check_after_its_savepoint_rolled_back_holds_the_lock_again() {
    let cluster = Cluster::start("shard-savepoint", &[]);
    let dba = shard(&cluster, "shard_1").await;
    let client = cluster.connect("shard_1").await;
    let client_pid = pid(&client).await;
    begin(&client, "READ COMMITTED", 41, "7").await;
    client
        .batch_execute(
            "SAVEPOINT s; SELECT shard_directory.assert_directory_version(); ROLLBACK TO SAVEPOINT s;
             SELECT shard_directory.assert_directory_version();",
        )
        .await
        .unwrap();
    let db = fence_gives_up(&dba).await;
    assert!(
        db.message().contains(&format!("pid {client_pid}")),
        "{}",
        db.message()
    );
    client.batch_execute("COMMIT").await.unwrap();
    dba.execute("SELECT shard_directory.fence_frozen('tenant', '8842')", &[])
        .await
        .expect("with nothing in flight the fence goes through");
}

#[tokio::test]
async fn raising_min_accepted_waits_for_checked_transactions_in_flight() {
    let cluster = Cluster::start("shard-raise", &[]);
    let dba = shard(&cluster, "shard_1").await;
    let client = cluster.connect("shard_1").await;
    let raiser = cluster.connect("shard_1").await;
    let raiser_pid = pid(&raiser).await;

    begin(&client, "READ COMMITTED", 5, "1").await;
    client
        .execute("SELECT shard_directory.assert_directory_version()", &[])
        .await
        .unwrap();
    let raise = tokio::spawn(async move {
        raiser
            .query_one("SELECT shard_directory.raise_min_accepted(6)", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    });
    blocked_on(
        &dba,
        raiser_pid,
        ANY_LOCK,
        "the raise to wait for the checked transaction",
    )
    .await;
    insert(&client, "1", "before the raise").await.unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        tokio::time::timeout(DEADLINE, raise)
            .await
            .unwrap()
            .unwrap(),
        6
    );

    let (message, detail) = retryable(&write(&client, 5, "1", "after").await.unwrap_err());
    assert_eq!(message, "stale shard directory (client 5, minimum 6)");
    assert_eq!(detail["reason"], "stale");
    write(&client, 6, "1", "fresh").await.unwrap();
}

#[tokio::test]
async fn the_guides_stale_v41_client_is_refused_and_lands_on_the_right_shard_at_v42() {
    let cluster = Cluster::start("shard-guide", &[]);
    let shard_1 = shard(&cluster, "shard_1").await;
    let shard_2 = shard(&cluster, "shard_2").await;
    write(&shard_1, 41, "8842", "before the move")
        .await
        .unwrap();

    // The move completes at directory version 42.
    shard_1
        .execute(
            "SELECT shard_directory.fence_moved('tenant', '8842', 'shard_2', 42)",
            &[],
        )
        .await
        .unwrap();
    shard_2
        .execute(
            "SELECT shard_directory.fence_owned('tenant', '8842', 42)",
            &[],
        )
        .await
        .unwrap();

    // Without the check this write would succeed on shard_1 and be invisible to correct reads.
    let (_, detail) = retryable(
        &write(&shard_1, 41, "8842", "stale write")
            .await
            .unwrap_err(),
    );
    assert_eq!(detail["moved_to"], "shard_2");
    // A v41 client that guessed the new shard is refused there too: it must refresh first.
    let (message, _) = retryable(
        &write(&shard_2, 41, "8842", "stale write")
            .await
            .unwrap_err(),
    );
    assert_eq!(
        message,
        "stale shard directory for tenant/8842 (client 41, minimum 42)"
    );
    // Refreshed to v42 and routed by moved_to: lands.
    write(&shard_2, 42, "8842", "retried").await.unwrap();
    assert_eq!(
        (count(&shard_1, "8842").await, count(&shard_2, "8842").await),
        (1, 1)
    );
    // Other tenants on shard_1 are not affected by this tenant's move.
    write(&shard_1, 41, "7", "other tenant").await.unwrap();
}

#[tokio::test]
async fn stats_count_rejections_across_backends_when_preloaded() {
    let cluster = Cluster::start("shard-stats", PRELOAD);
    let dba = shard(&cluster, "shard_1").await;
    dba.execute("SELECT shard_directory.raise_min_accepted(10)", &[])
        .await
        .unwrap();
    dba.execute("SELECT shard_directory.fence_frozen('tenant', '3')", &[])
        .await
        .unwrap();
    let a = cluster.connect("shard_1").await;
    let b = cluster.connect("shard_1").await;
    assert_eq!(
        retryable(&write(&a, 9, "1", "x").await.unwrap_err()).1["reason"],
        "stale"
    );
    assert_eq!(
        retryable(&write(&b, 9, "2", "x").await.unwrap_err()).1["reason"],
        "stale"
    );
    assert_eq!(
        retryable(&write(&b, 10, "3", "x").await.unwrap_err()).1["reason"],
        "frozen"
    );
    write(&a, 10, "1", "x").await.unwrap();
    let err = b
        .execute("SELECT shard_directory.assert_directory_version()", &[])
        .await
        .unwrap_err();
    assert_eq!(retryable(&err).1["reason"], "missing");
    // A TRUNCATE while tenant 3 is frozen here: it would wipe the rows its cutover carries.
    let err = a
        .batch_execute(
            "BEGIN; SELECT set_config('app.directory_version', '10', true); TRUNCATE orders",
        )
        .await
        .unwrap_err();
    assert_eq!(retryable(&err).1["reason"], "truncate_fenced");
    a.batch_execute("ROLLBACK").await.unwrap();

    let rows = dba
        .query(
            "SELECT reason, count FROM shard_directory.stats() ORDER BY reason",
            &[],
        )
        .await
        .unwrap();
    let stats: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let expected = [
        ("checks", 6),
        ("frozen", 1),
        ("invalid", 0),
        ("missing", 1),
        ("moved", 0),
        ("stale", 2),
        ("truncate_fenced", 1),
    ];
    assert_eq!(stats, expected.map(|(r, n)| (r.to_owned(), n)).to_vec());
}

/// `entity_stats()` as an operator reads it: each entity's checked transactions, once per
/// transaction however many statements it makes, from every backend, busiest first.
async fn entity_stats(c: &Client, top: i32) -> Vec<(String, i64)> {
    c.query(
        "SELECT entity_id, transactions FROM shard_directory.entity_stats($1)",
        &[&top],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[tokio::test]
async fn entity_stats_count_each_entitys_transactions_across_backends() {
    let cluster = Cluster::start("entity-stats", PRELOAD);
    let dba = shard(&cluster, "shard_1").await;
    dba.execute("SELECT shard_directory.fence_frozen('tenant', '3')", &[])
        .await
        .unwrap();
    let (a, b) = (
        cluster.connect("shard_1").await,
        cluster.connect("shard_1").await,
    );
    // Tenant 1: ten transactions of two writes each, from two backends; tenant 2: three.
    for (i, c) in [&a, &b].into_iter().cycle().take(10).enumerate() {
        begin(c, "READ COMMITTED", 1, "1").await;
        insert(c, "1", &format!("first {i}")).await.unwrap();
        insert(c, "1", &format!("second {i}")).await.unwrap();
        c.batch_execute("COMMIT").await.unwrap();
    }
    for i in 0..3 {
        write(&b, 1, "2", &i.to_string()).await.unwrap();
    }
    // Refused: not counted. Undeclared: counted by the row trigger, once.
    write(&a, 1, "3", "x").await.unwrap_err();
    a.batch_execute(
        "BEGIN; SELECT set_config('app.directory_version', '1', true);
         INSERT INTO orders VALUES ('4', 'x'), ('4', 'y'); COMMIT;",
    )
    .await
    .unwrap();
    let counted = [("1", 10), ("2", 3), ("4", 1)].map(|(id, n)| (id.to_owned(), n));
    assert_eq!(entity_stats(&dba, 20).await, counted);
    assert_eq!(entity_stats(&dba, 1).await, counted[..1]);
    // Counting off: nothing more is counted.
    a.batch_execute("SET shard_directory.entity_stats = off")
        .await
        .unwrap();
    write(&a, 1, "2", "uncounted").await.unwrap();
    assert_eq!(entity_stats(&dba, 20).await, counted);
    // Two windows without a transaction, and the counts are gone.
    for sql in [
        "ALTER SYSTEM SET shard_directory.entity_stats_window = 1",
        "SELECT pg_reload_conf()",
    ] {
        dba.batch_execute(sql).await.unwrap();
    }
    eventually("the counts to age out of the window", DEADLINE, || async {
        entity_stats(&dba, 20).await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn advancing_a_sequence_waits_for_nextval_in_flight_and_never_goes_back() {
    let cluster = Cluster::start("advance", &[]);
    let (a, b) = (shard(&cluster, "app").await, cluster.connect("app").await);
    a.batch_execute("CREATE SEQUENCE ids").await.unwrap();
    let advance = |past: i64| format!("SELECT shard_directory.advance_sequence('ids', {past})");
    // A transaction that took a value and is still open: the advance waits for it.
    b.batch_execute("BEGIN; SELECT nextval('ids')")
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let sql = advance(100);
        async move {
            let c = a;
            let last: i64 = c.query_one(&sql, &[]).await.unwrap().get(0);
            (c, last)
        }
    });
    let observer = cluster.connect("app").await;
    let waiting: i32 = eventually("the advance to wait", DEADLINE, || async {
        observer
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE '%advance_sequence%' \
                 AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .map(|r| r.get(0))
    })
    .await;
    blocked_on(
        &observer,
        waiting,
        ANY_LOCK,
        "the advance to wait for nextval",
    )
    .await;
    b.batch_execute("COMMIT").await.unwrap();
    let (a, last) = waiter.await.unwrap();
    assert_eq!(last, 100);
    let next: i64 = b
        .query_one("SELECT nextval('ids')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(next, 101);
    // While an advance holds the sequence, nextval waits for it, so none can slip in between its
    // read and its set.
    a.batch_execute(&format!("BEGIN; {}", advance(500)))
        .await
        .unwrap();
    let b_pid = pid(&b).await;
    let taking = tokio::spawn(async move {
        let v: i64 = b
            .query_one("SELECT nextval('ids')", &[])
            .await
            .unwrap()
            .get(0);
        v
    });
    blocked_on(
        &observer,
        b_pid,
        ANY_LOCK,
        "nextval to wait for the advance",
    )
    .await;
    a.batch_execute("COMMIT").await.unwrap();
    assert_eq!(taking.await.unwrap(), 501);
    // Never backwards, and only for a role that may set it.
    let last: i64 = a.query_one(&advance(10), &[]).await.unwrap().get(0);
    assert_eq!(last, 501);
    a.batch_execute(
        "CREATE ROLE sd_reader; GRANT USAGE ON SCHEMA shard_directory TO sd_reader; \
         GRANT EXECUTE ON FUNCTION shard_directory.advance_sequence(regclass, bigint) TO sd_reader; \
         GRANT SELECT ON SEQUENCE ids TO sd_reader; SET ROLE sd_reader",
    )
    .await
    .unwrap();
    let e = a.query_one(&advance(1000), &[]).await.unwrap_err();
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e:?}");
}

#[tokio::test]
async fn the_extension_refuses_a_database_that_is_not_utf8() {
    let cluster = Cluster::start("latin1", &[]);
    let admin = cluster.connect("postgres").await;
    admin
        .batch_execute("CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
        .await
        .unwrap();
    let e = cluster
        .connect("latin")
        .await
        .batch_execute("CREATE EXTENSION shard_directory")
        .await
        .unwrap_err();
    let db = e.as_db_error().expect("a server error");
    assert_eq!(db.code(), &SqlState::FEATURE_NOT_SUPPORTED);
    assert!(
        db.message().contains("UTF8") && db.message().contains("LATIN1"),
        "{}",
        db.message()
    );
    let installed: i64 = cluster
        .connect("latin")
        .await
        .query_one(
            "SELECT count(*) FROM pg_extension WHERE extname = 'shard_directory'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(installed, 0);
}

/// A checked transaction prepared for two-phase commit keeps the check's lock with no backend:
/// a fence change that waited for it named no blocker ("none left"). It names the prepared
/// transaction's gid, and the hint says how to resolve it.
#[tokio::test]
async fn a_fence_waiting_for_a_prepared_checked_transaction_names_its_gid() {
    let cluster = Cluster::start("shard-prepared", &[("max_prepared_transactions", "2")]);
    let dba = shard(&cluster, "shard_1").await;
    let client = cluster.connect("shard_1").await;
    begin(&client, "READ COMMITTED", 41, "7").await;
    client
        .batch_execute(
            "SELECT shard_directory.assert_directory_version();
             INSERT INTO orders VALUES ('7', 'book'); PREPARE TRANSACTION 'order-7'",
        )
        .await
        .unwrap();
    let db = fence_gives_up(&dba).await;
    assert!(
        db.message().contains("prepared transaction 'order-7'"),
        "{}",
        db.message()
    );
    assert!(
        db.hint().is_some_and(|h| h.contains("COMMIT PREPARED")),
        "{:?}",
        db.hint()
    );
    dba.batch_execute("COMMIT PREPARED 'order-7'")
        .await
        .unwrap();
    dba.execute("SELECT shard_directory.fence_frozen('tenant', '8842')", &[])
        .await
        .expect("once it is resolved the fence goes through");
}
