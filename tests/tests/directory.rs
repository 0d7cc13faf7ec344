//! The directory role seen from real client connections: notification at commit only, the
//! version order of concurrent writers, refused steps as a client sees them, `placement_at`
//! across transactions.

use std::time::Duration;

use shard_directory_e2e::{eventually, Cluster};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

const DEADLINE: Duration = Duration::from_secs(10);

async fn directory() -> (Cluster, Client) {
    let cluster = Cluster::start("dir", &[]);
    cluster.create_database_with_extension("directory").await;
    let client = cluster.connect("directory").await;
    client
        .batch_execute(
            "INSERT INTO shard_directory.shards (shard_name, region) VALUES ('shard_1', 'eu'), ('shard_2', 'eu');
             INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
             VALUES ('tenant', '8842', 'shard_1'), ('tenant', '7', 'shard_1')",
        )
        .await
        .expect("seed directory");
    (cluster, client)
}

async fn version(c: &Client) -> i64 {
    c.query_one("SELECT shard_directory.current_version()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn listeners_hear_the_new_version_at_commit_and_nothing_on_rollback() {
    let (cluster, writer) = directory().await;
    let mut listener = cluster.connect_listening("directory").await;
    listener
        .client
        .batch_execute("LISTEN shard_directory")
        .await
        .unwrap();

    writer
        .batch_execute(
            "BEGIN; SELECT shard_directory.begin_move('tenant', '8842', 'shard_2'); ROLLBACK",
        )
        .await
        .unwrap();
    writer
        .batch_execute(
            "UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = 'none'",
        )
        .await
        .unwrap();
    writer.batch_execute("BEGIN").await.unwrap();
    let v: i64 = writer
        .query_one(
            "SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        listener.notifications.try_recv().is_err(),
        "nothing is delivered before COMMIT"
    );
    writer.batch_execute("COMMIT").await.unwrap();

    // Notifications arrive in order: had the rollback or the no-op sent one, it would come first.
    let n = tokio::time::timeout(DEADLINE, listener.notifications.recv())
        .await
        .expect("a notification after COMMIT")
        .expect("listener open");
    assert_eq!(
        (n.channel(), n.payload()),
        ("shard_directory", v.to_string().as_str())
    );
    assert_eq!(version(&writer).await, v);
}

#[tokio::test]
async fn concurrent_writers_get_distinct_versions_in_commit_order() {
    let (cluster, first) = directory().await;
    let second = cluster.connect("directory").await;
    let mut listener = cluster.connect_listening("directory").await;
    listener
        .client
        .batch_execute("LISTEN shard_directory")
        .await
        .unwrap();
    let second_pid: i32 = second
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);

    first.batch_execute("BEGIN").await.unwrap();
    let v_first: i64 = first
        .query_one("SELECT shard_directory.freeze('tenant', '8842')", &[])
        .await
        .unwrap()
        .get(0);

    // The second writer changes a different entry, so only the version lock can make it wait.
    let racer = tokio::spawn(async move {
        second.batch_execute("BEGIN").await.unwrap();
        let v: i64 = second
            .query_one("SELECT shard_directory.freeze('tenant', '7')", &[])
            .await
            .unwrap()
            .get(0);
        second.batch_execute("COMMIT").await.unwrap();
        v
    });
    eventually(
        "the second writer to wait on the version lock",
        DEADLINE,
        || async {
            let waiting: bool = first
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted \
                 AND locktype = 'object' AND classid = 'pg_class'::regclass \
                 AND objid = 'shard_directory.shard_directory_version'::regclass)",
                    &[&second_pid],
                )
                .await
                .unwrap()
                .get(0);
            waiting.then_some(())
        },
    )
    .await;
    assert!(!racer.is_finished());
    first.batch_execute("COMMIT").await.unwrap();
    let v_second = tokio::time::timeout(DEADLINE, racer)
        .await
        .expect("second writer finishes")
        .unwrap();

    assert_eq!(v_second, v_first + 1, "versions follow commit order");
    for expected in [v_first, v_second] {
        let n = tokio::time::timeout(DEADLINE, listener.notifications.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.payload(), expected.to_string());
    }
}

#[tokio::test]
async fn a_refused_step_reaches_the_client_with_its_sqlstate_and_changes_nothing() {
    let (_cluster, c) = directory().await;
    let before = version(&c).await;
    // The guide's verification step re-points an active entry directly: refused.
    let err = c
        .batch_execute(
            "UPDATE shard_directory.shard_directory SET shard_name = 'shard_2', version = version + 1
             WHERE entity_type = 'tenant' AND entity_id = '8842'",
        )
        .await
        .unwrap_err();
    let db = err.as_db_error().expect("a database error");
    assert_eq!(db.code(), &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE);
    assert!(
        db.message()
            .contains("tenant/8842: active on shard_1 -> active on shard_2"),
        "{}",
        db.message()
    );
    assert!(db.hint().unwrap_or_default().contains("allow_repoint"));
    let shard: String = c
        .query_one(
            "SELECT shard_name FROM shard_directory.shard_directory WHERE entity_id = '8842'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!((shard.as_str(), version(&c).await), ("shard_1", before));

    let err = c
        .query_one(
            "SELECT shard_directory.begin_move('tenant', '8842', 'shard_9')",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::FOREIGN_KEY_VIOLATION));

    // The emergency path works, in one transaction.
    c.batch_execute(
        "BEGIN; SET LOCAL shard_directory.allow_repoint = on;
         UPDATE shard_directory.shard_directory SET shard_name = 'shard_2' WHERE entity_id = '8842'; COMMIT",
    )
    .await
    .unwrap();
    assert_eq!(version(&c).await, before + 1);
}

/// The directory's three steps of a move of tenant 8842 to `shard`, each in its own statement.
async fn walk_move(c: &Client, shard: &str) {
    for step in [
        format!("begin_move('tenant', '8842', '{shard}')"),
        "freeze('tenant', '8842')".to_owned(),
        "complete_move('tenant', '8842')".to_owned(),
    ] {
        c.batch_execute(&format!("SELECT shard_directory.{step}"))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn placement_at_answers_for_a_time_between_two_moves() {
    let (_cluster, c) = directory().await;
    let clock = "SELECT clock_timestamp()::text";
    let before_insert = "2000-01-01 00:00:00+00".to_owned();
    walk_move(&c, "shard_2").await;
    let between: String = c.query_one(clock, &[]).await.unwrap().get(0);
    walk_move(&c, "shard_1").await;
    let placement = |at: String| {
        let c = &c;
        async move {
            c.query_one(
                "SELECT shard_directory.placement_at('tenant', '8842', $1::text::timestamptz)",
                &[&at],
            )
            .await
            .unwrap()
            .get::<_, Option<String>>(0)
        }
    };
    assert_eq!(placement(between).await.as_deref(), Some("shard_2"));
    assert_eq!(placement(before_insert).await, None);
    let now: String = c.query_one(clock, &[]).await.unwrap().get(0);
    assert_eq!(placement(now).await.as_deref(), Some("shard_1"));
}

/// Issue 8, item 12: a transaction that started first but committed last is the latest
/// placement. Ordered by `now()` (transaction start) history would say the opposite.
#[tokio::test]
async fn placement_at_follows_commit_order_not_transaction_start() {
    let (cluster, early) = directory().await;
    let late = cluster.connect("directory").await;
    // `early` starts its transaction (and its now()) before `late` makes any change.
    early.batch_execute("BEGIN; SELECT now()").await.unwrap();
    walk_move(&late, "shard_2").await;
    walk_move(&early, "shard_1").await;
    early.batch_execute("COMMIT").await.unwrap();
    let row = late
        .query_one(
            "SELECT shard_directory.placement_at('tenant', '8842', clock_timestamp()), \
             (SELECT shard_name FROM shard_directory.shard_directory WHERE entity_id = '8842'), \
             (SELECT bool_and(h.changed_at < l.changed_at) FROM shard_directory.shard_directory_history h, \
                     shard_directory.shard_directory_history l \
               WHERE h.new_shard = 'shard_1' AND h.transition = 'cutover' \
                 AND l.new_shard = 'shard_2' AND l.transition = 'cutover')",
            &[],
        )
        .await
        .unwrap();
    let (placement, current, started_first): (Option<String>, String, bool) =
        (row.get(0), row.get(1), row.get(2));
    assert!(
        started_first,
        "the last cutover's transaction started first"
    );
    assert_eq!(current, "shard_1");
    assert_eq!(placement.as_deref(), Some("shard_1"));
}
