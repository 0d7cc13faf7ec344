//! The directory role seen from real client connections: notification at commit only, the
//! version order of concurrent writers, refused steps as a client sees them, `placement_at`
//! across transactions, `changes_since` in the caller's snapshot.

use std::time::Duration;

use shard_directory_e2e::{backend_pid as pid, blocked_on, column, eventually, Cluster, Listener};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

const DEADLINE: Duration = Duration::from_secs(10);

/// With the library preloaded, a statement expects its version from shared memory; without, from
/// the version row. Tests of the expected version run both.
const PRELOAD: &[(&str, &str)] = &[("shared_preload_libraries", "shard_directory")];
const EITHER: [&[(&str, &str)]; 2] = [&[], PRELOAD];

async fn directory() -> (Cluster, Client) {
    directory_with(&[]).await
}

pub(crate) async fn directory_with(settings: &[(&str, &str)]) -> (Cluster, Client) {
    let cluster = Cluster::start("dir", settings);
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

/// A connection listening on the directory's channel.
async fn listening(cluster: &Cluster) -> Listener {
    let listener = cluster.connect_listening("directory").await;
    listener
        .client
        .batch_execute("LISTEN shard_directory")
        .await
        .unwrap();
    listener
}

/// The directory roles of docs/operations.md, with exactly their grants: `directory_writer` edits entries, `dba`
/// is a writer who also registers shards and changes their regions.
async fn readme_roles(c: &Client) {
    c.batch_execute(
        "CREATE ROLE directory_writer; CREATE ROLE dba;
         GRANT USAGE ON SCHEMA shard_directory TO directory_writer;
         GRANT SELECT, INSERT, UPDATE, DELETE ON shard_directory.shard_directory TO directory_writer;
         GRANT directory_writer TO dba;
         GRANT SELECT, INSERT, UPDATE ON shard_directory.shards TO dba;
         GRANT SELECT ON shard_directory.shard_directory_history, shard_directory.shard_moves TO dba",
    )
    .await
    .expect("the documented roles");
}

/// A session of `cluster`'s directory database acting as `role`.
async fn connect_as(cluster: &Cluster, role: &str) -> Client {
    let c = cluster.connect("directory").await;
    c.batch_execute(&format!("SET ROLE {role}")).await.unwrap();
    c
}

/// A wait on the lock that orders versions.
const VERSION_LOCK: &str = "locktype = 'object' AND classid = 'pg_class'::regclass \
     AND objid = 'shard_directory.shard_directory_version'::regclass";
/// A wait on another transaction (a row it has locked).
const ROW_LOCK: &str = "locktype = 'transactionid'";

/// `(entity_id, version)` of the given entries, and the versions history recorded after `since`.
async fn stamps(c: &Client, since: i64) -> (Vec<(String, i64)>, Vec<(String, i64)>) {
    let rows = |sql: &'static str| async move {
        c.query(sql, &[&since])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect::<Vec<(String, i64)>>()
    };
    (
        rows(
            "SELECT entity_id, version FROM shard_directory.shard_directory \
              WHERE version > $1 ORDER BY entity_id",
        )
        .await,
        rows(
            "SELECT entity_id, version FROM shard_directory.shard_directory_history \
              WHERE version > $1 ORDER BY version, entity_id",
        )
        .await,
    )
}

#[tokio::test]
async fn listeners_hear_the_new_version_at_commit_and_nothing_on_rollback() {
    let (cluster, writer) = directory().await;
    let mut listener = listening(&cluster).await;

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

/// The first change of a lineage (here: the first after a restart) notifies its epoch on
/// `shard_directory_epoch`, as `<version> <epoch>`, just before the version's own notification,
/// whose payload stays the plain version; a change in a lineage this server minted notifies only
/// the version. A watcher thus knows which history a notified version belongs to.
#[tokio::test]
async fn the_first_change_of_a_lineage_notifies_its_epoch_before_its_version() {
    let (cluster, _) = directory().await;
    cluster.stop();
    cluster.restart();
    let writer = cluster.connect("directory").await;
    let mut listener = cluster.connect_listening("directory").await;
    listener
        .client
        .batch_execute("LISTEN shard_directory; LISTEN shard_directory_epoch")
        .await
        .unwrap();
    let freeze = |id: &'static str| {
        let writer = &writer;
        async move {
            let v: i64 = writer
                .query_one("SELECT shard_directory.freeze('tenant', $1)", &[&id])
                .await
                .unwrap()
                .get(0);
            let epoch: String = writer
                .query_one("SELECT shard_directory.directory_epoch()", &[])
                .await
                .unwrap()
                .get(0);
            (v, epoch)
        }
    };
    let (first, minted) = freeze("8842").await;
    let (second, same) = freeze("7").await;
    assert_eq!(same, minted, "one lineage");
    let mut heard = Vec::new();
    while heard.len() < 3 {
        let n = tokio::time::timeout(DEADLINE, listener.notifications.recv())
            .await
            .expect("the notifications")
            .expect("listener open");
        heard.push((n.channel().to_owned(), n.payload().to_owned()));
    }
    let expected = [
        ("shard_directory_epoch", format!("{first} {minted}")),
        ("shard_directory", first.to_string()),
        ("shard_directory", second.to_string()),
    ]
    .map(|(c, p)| (c.to_owned(), p));
    assert_eq!(heard, expected);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.notifications.recv())
            .await
            .is_err(),
        "nothing more"
    );
}

#[tokio::test]
async fn concurrent_writers_get_distinct_versions_in_commit_order() {
    let (cluster, first) = directory().await;
    let second = cluster.connect("directory").await;
    let mut listener = listening(&cluster).await;
    let second_pid = pid(&second).await;

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
    blocked_on(
        &first,
        second_pid,
        VERSION_LOCK,
        "the second writer to wait on the version lock",
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

/// A statement takes the version lock only once its rows are written, so one that waits for an
/// entry holds nothing the entry's holder needs: a move step (which locks its entry, then writes
/// it) and a statement changing that entry and another both commit. The statement stamped its
/// first row before the step took the version it expected; both rows end up stamped with the
/// version it got.
#[tokio::test]
async fn a_statement_waiting_for_an_entry_does_not_deadlock_with_its_holder_and_is_stamped_again() {
    let (cluster, step) = directory().await;
    let statement = cluster.connect("directory").await;
    let statement_pid = pid(&statement).await;
    // A DBA's index on version: stamping a row again is then never a HOT update, and the rows
    // must still be found through every index (the partial one on moving entries too).
    step.batch_execute("CREATE INDEX dba_version_idx ON shard_directory.shard_directory (version)")
        .await
        .unwrap();
    let before = version(&step).await;

    step.batch_execute(
        "BEGIN; SELECT FROM shard_directory.shard_directory WHERE entity_id = '8842' FOR UPDATE",
    )
    .await
    .unwrap();
    // Through the primary key, where '7' sorts before '8842': the statement writes 7, then waits
    // for 8842.
    statement
        .batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await
        .unwrap();
    let racer = tokio::spawn(async move {
        statement
            .execute(
                "UPDATE shard_directory.shard_directory SET region = 'eu' \
                 WHERE entity_type = 'tenant' AND entity_id IN ('7', '8842')",
                &[],
            )
            .await
    });
    blocked_on(
        &step,
        statement_pid,
        ROW_LOCK,
        "the statement to wait for 8842",
    )
    .await;
    let stepped: i64 = step
        .query_one(
            "SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')",
            &[],
        )
        .await
        .expect("the step is not a deadlock victim")
        .get(0);
    step.batch_execute("COMMIT").await.unwrap();
    let changed = tokio::time::timeout(DEADLINE, racer)
        .await
        .expect("the statement finishes")
        .unwrap()
        .expect("the statement is not a deadlock victim");

    assert_eq!((changed, stepped), (2, before + 1));
    let (entries, history) = stamps(&step, before).await;
    let got = before + 2;
    assert_eq!(entries, [("7".into(), got), ("8842".into(), got)]);
    assert_eq!(
        history,
        [
            ("8842".into(), before + 1),
            ("7".into(), got),
            ("8842".into(), got)
        ]
    );
    assert_eq!(version(&step).await, got);
    step.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await
        .unwrap();
    let ids = |sql: &'static str| {
        let step = &step;
        async move { column::<String>(step, sql, &[&got]).await }
    };
    assert_eq!(
        ids("SELECT entity_id FROM shard_directory.shard_directory WHERE version = $1 ORDER BY 1")
            .await,
        ["7", "8842"]
    );
    assert_eq!(
        ids("SELECT entity_id FROM shard_directory.shard_directory \
             WHERE shard_name = 'shard_1' AND state <> 'active' AND version = $1")
        .await,
        ["8842"]
    );
}

/// A statement that expected the version of a writer holding the version lock (one past it)
/// gets that writer's version when it rolls back: its row is stamped again, and no version is
/// skipped.
#[tokio::test]
async fn a_statement_that_expected_a_version_past_a_rolled_back_writer_is_stamped_again() {
    for settings in EITHER {
        expected_a_version_past_a_rolled_back_writer(settings).await;
    }
}

async fn expected_a_version_past_a_rolled_back_writer(settings: &[(&str, &str)]) {
    let (cluster, first) = directory_with(settings).await;
    let second = cluster.connect("directory").await;
    let second_pid = pid(&second).await;
    let before = version(&first).await;

    // A move step takes its version at once, and holds the lock until its transaction ends.
    first
        .batch_execute("BEGIN; SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')")
        .await
        .unwrap();
    let racer = tokio::spawn(async move {
        second
            .execute(
                "UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = '7'",
                &[],
            )
            .await
    });
    blocked_on(
        &first,
        second_pid,
        VERSION_LOCK,
        "the second writer to wait on the version lock",
    )
    .await;
    first.batch_execute("ROLLBACK").await.unwrap();
    let changed = tokio::time::timeout(DEADLINE, racer)
        .await
        .expect("the second writer finishes")
        .unwrap()
        .unwrap();

    assert_eq!(changed, 1);
    let got = before + 1;
    let (entries, history) = stamps(&first, before).await;
    assert_eq!(
        (entries, history),
        (vec![("7".into(), got)], vec![("7".into(), got)])
    );
    assert_eq!(version(&first).await, got);
}

/// Writers race, each transaction changing random entries in one to three statements:
/// statements stamp their rows with the version they expect and take the lock at their
/// transaction's commit, so many are stamped again. Whatever the interleaving, no transaction
/// is a deadlock victim (each changes its entries in key order, so their row locks alone cannot
/// deadlock; taken at each statement's end, the version lock did: the first statement's lock was
/// held while the second waited for a row), every statement gets one version, versions go up by
/// one with no gap, listeners hear them in order, and each entry and its history carry the
/// version of the statement that last changed it.
#[tokio::test]
async fn racing_writers_leave_one_version_per_statement_in_commit_order() {
    for settings in EITHER {
        racing_writers(settings).await;
    }
}

async fn racing_writers(settings: &[(&str, &str)]) {
    const WRITERS: usize = 4;
    const TRANSACTIONS: usize = 75;
    const ENTRIES: usize = 20;
    let (cluster, c) = directory_with(settings).await;
    c.batch_execute(&format!(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
         SELECT 'tenant', 'r' || lpad(g::text, 2, '0'), 'shard_1' FROM generate_series(1, {ENTRIES}) g"
    ))
    .await
    .unwrap();
    let mut listener = listening(&cluster).await;
    let before = version(&c).await;
    let updates = || async {
        c.query_one(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'shard_directory.shard_directory'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
    };
    let updates_before = updates().await;

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = cluster.connect("directory").await;
        writers.push(tokio::spawn(async move {
            // Rows in key order (through the primary key), as any two statements then lock them.
            client
                .batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
                .await
                .unwrap();
            let mut rng = fastrand::Rng::with_seed(w as u64);
            let (mut rows, mut statements) = (0, 0);
            for _ in 0..TRANSACTIONS {
                // Distinct entries in key order, split over the transaction's statements.
                let count = rng.usize(1..=3);
                let mut ids: Vec<String> = (0..count + rng.usize(0..=2))
                    .map(|_| format!("r{:02}", rng.usize(1..=ENTRIES)))
                    .collect();
                ids.sort();
                ids.dedup();
                client.batch_execute("BEGIN").await?;
                for part in ids.chunks(ids.len().div_ceil(count)) {
                    rows += client
                        .execute(
                            "UPDATE shard_directory.shard_directory \
                             SET region = CASE WHEN region IS NULL THEN 'eu' END \
                             WHERE entity_type = 'tenant' AND entity_id = ANY($1)",
                            &[&part],
                        )
                        .await?;
                    statements += 1;
                }
                client.batch_execute("COMMIT").await?;
            }
            Ok::<_, tokio_postgres::Error>((rows, statements))
        }));
    }
    let (mut rows, mut statements) = (0, 0i64);
    for w in writers {
        let (r, s) = w
            .await
            .unwrap()
            .expect("no transaction is a deadlock victim");
        rows += r;
        statements += s;
    }

    let after = version(&c).await;
    assert_eq!(
        after,
        before + statements,
        "one version per statement, no gap"
    );
    let mut heard = Vec::new();
    while heard.len() < statements as usize {
        let n = tokio::time::timeout(DEADLINE, listener.notifications.recv())
            .await
            .expect("every version is notified")
            .unwrap();
        heard.push(n.payload().parse::<i64>().unwrap());
    }
    assert_eq!(
        heard,
        ((before + 1)..=after).collect::<Vec<_>>(),
        "heard in version order"
    );
    let history: (i64, i64, i64) = {
        let r = c
            .query_one(
                "SELECT count(*), count(DISTINCT version), count(*) FILTER (WHERE version > $2) \
                 FROM shard_directory.shard_directory_history WHERE version > $1",
                &[&before, &after],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(history, (rows as i64, statements, 0));
    let stale: i64 = c
        .query_one(
            "SELECT count(*) FROM shard_directory.shard_directory d, LATERAL ( \
               SELECT version, new_region FROM shard_directory.shard_directory_history h \
               WHERE (h.entity_type, h.entity_id) = (d.entity_type, d.entity_id) \
               ORDER BY version DESC LIMIT 1) last \
             WHERE d.version <> last.version OR d.region IS DISTINCT FROM last.new_region",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale, 0, "entries carry their last change's version");
    let time_went_back: i64 = c
        .query_one(
            "SELECT count(*) FILTER (WHERE back) FROM ( \
               SELECT version_at < lag(version_at) OVER (ORDER BY version) AS back \
               FROM shard_directory.shard_directory_history WHERE version > $1) h",
            &[&before],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(time_went_back, 0, "version_at follows version order");
    // The race was run: some statements expected a version another writer took, and stamped
    // their rows again (a second update of the row; statistics reach the view within a second
    // or so of the writers' transactions).
    let stamped_again = eventually("the writers' statistics", DEADLINE, || async {
        let n = updates().await - updates_before - rows as i64;
        (n > 0).then_some(n)
    })
    .await;
    println!(
        "{settings:?}: {statements} statements, {rows} rows, {stamped_again} rows stamped again"
    );
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

/// A transaction that started first but committed last is the latest
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

/// What `changes_since(since)` answers: the version, whether it is complete, the ids changed.
async fn changes(c: &Client, since: i64) -> (i64, bool, Vec<String>) {
    let r = c
        .query_one(
            "SELECT version, complete, coalesce(entity_ids, '{}') \
             FROM shard_directory.changes_since($1)",
            &[&since],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// `changes_since` answers from the snapshot of the query that calls it: a transaction that
/// reads twice (REPEATABLE READ) gets the same answer while another commits a change in
/// between, and then the version and the keys changed up to it agree. A router relies on the
/// pair: it stamps every cached entry not listed with the version returned.
#[tokio::test]
async fn changes_since_answers_from_the_calling_querys_snapshot() {
    // Preloaded, the version row is looked for where the last bump wrote it: a row version the
    // snapshot cannot see yet.
    for settings in EITHER {
        let (cluster, c) = directory_with(settings).await;
        let since = version(&c).await;
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .await
            .unwrap();
        let nothing = (since, true, vec![]);
        assert_eq!(changes(&c, since).await, nothing);
        let other = cluster.connect("directory").await;
        other
            .batch_execute(
                "UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = '7'",
            )
            .await
            .unwrap();
        assert_eq!(version(&other).await, since + 1);
        assert_eq!(
            changes(&c, since).await,
            nothing,
            "the transaction's snapshot, not the latest commit ({settings:?})"
        );
        c.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            changes(&c, since).await,
            (since + 1, true, vec!["7".to_owned()])
        );
    }
}

/// The version row is updated by every change, and its page keeps each version until pruned.
/// PostgreSQL prunes a page when a read finds it filling up; the extension reads the row where
/// the last bump wrote it, and must prune as it reads, or the table grows by a page every few
/// dozen changes until autovacuum comes (off here, on the table). Either way, with the library
/// preloaded and without.
#[tokio::test]
async fn the_version_table_stays_one_page_under_a_thousand_changes() {
    for settings in EITHER {
        let (_cluster, c) = directory_with(settings).await;
        c.batch_execute(
            "ALTER TABLE shard_directory.shard_directory_version SET (autovacuum_enabled = false)",
        )
        .await
        .unwrap();
        let before = version(&c).await;
        for _ in 0..1000 {
            c.batch_execute(
                "UPDATE shard_directory.shard_directory \
                 SET region = CASE WHEN region IS NULL THEN 'eu' END WHERE entity_id = '7'",
            )
            .await
            .unwrap();
        }
        assert_eq!(version(&c).await, before + 1000);
        let pages: i64 = c
            .query_one(
                "SELECT pg_relation_size('shard_directory.shard_directory_version') / 8192",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            pages <= 2,
            "{pages} pages after 1000 changes ({settings:?})"
        );
    }
}

/// The owner dropped the version table's primary key: the extension's own
/// writes keep no index then, and must not read the missing list of indexes as one (undefined
/// behaviour; a debug build aborted the server at COMMIT).
#[tokio::test]
async fn the_directory_is_written_without_crashing_after_its_tables_lost_their_indexes() {
    for settings in EITHER {
        let (cluster, c) = directory_with(settings).await;
        let before = version(&c).await;
        c.batch_execute(
            "ALTER TABLE shard_directory.shard_directory_version \
                 DROP CONSTRAINT shard_directory_version_pkey;
             UPDATE shard_directory.shard_directory SET region = 'eu' WHERE entity_id = '7'",
        )
        .await
        .unwrap();
        assert_eq!(version(&c).await, before + 1);
        assert_eq!(cluster.crashes(), 0, "{}", cluster.server_log());
    }
}

/// A DBA's trigger that refuses any change of entry `7` after the extension's AFTER ROW trigger
/// has bumped the version for it (triggers fire in name order): the failed statement took a
/// version, its lock and a notification, all rolled back with it.
async fn refuse_changes_of_seven(c: &Client) {
    c.batch_execute(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
         VALUES ('tenant', '9', 'shard_1');
         CREATE FUNCTION refuse_seven() RETURNS trigger LANGUAGE plpgsql
           AS $$ BEGIN RAISE EXCEPTION 'entry 7 is kept as it is'; END $$;
         CREATE TRIGGER zz_refuse_seven AFTER UPDATE ON shard_directory.shard_directory
           FOR EACH ROW WHEN (NEW.entity_id = '7') EXECUTE FUNCTION refuse_seven()",
    )
    .await
    .expect("the DBA's trigger");
}

/// An UPDATE of entry `id` that changes it (its region, set or cleared).
pub(crate) fn toggle(id: &str) -> String {
    format!(
        "UPDATE shard_directory.shard_directory SET region = CASE WHEN region IS NULL THEN 'eu' END \
         WHERE entity_id = '{id}'"
    )
}

/// The next `n` notifications' versions.
async fn heard(listener: &mut Listener, n: usize) -> Vec<i64> {
    let mut versions = Vec::new();
    for _ in 0..n {
        let note = tokio::time::timeout(DEADLINE, listener.notifications.recv())
            .await
            .expect("a notification")
            .expect("listener open");
        versions.push(note.payload().parse().unwrap());
    }
    versions
}

/// A statement that failed inside a savepoint (after its change was recorded) takes its frame
/// with it: the next statement at the same level gets a version of its own at commit, and a
/// writer that committed in between gets another, not the same one; the failed change is in no
/// history and no notification. Nested savepoints and a PL/pgSQL EXCEPTION block's loop too,
/// preloaded and not.
#[tokio::test]
async fn a_statement_after_a_rolled_back_savepoint_gets_its_own_version_and_notification() {
    for settings in EITHER {
        after_a_rolled_back_savepoint(settings).await;
    }
}

async fn after_a_rolled_back_savepoint(settings: &[(&str, &str)]) {
    let (cluster, dba) = directory_with(settings).await;
    refuse_changes_of_seven(&dba).await;
    readme_roles(&dba).await;
    let first = connect_as(&cluster, "directory_writer").await;
    let second = connect_as(&cluster, "directory_writer").await;
    let mut listener = listening(&cluster).await;
    let before = version(&dba).await;

    first.batch_execute("BEGIN; SAVEPOINT s").await.unwrap();
    let refused = first.batch_execute(&toggle("7")).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&SqlState::RAISE_EXCEPTION),
        "{refused}"
    );
    first
        .batch_execute(&format!("ROLLBACK TO SAVEPOINT s; {}", toggle("8842")))
        .await
        .unwrap();
    // The second writer expects the same version as the first and commits before it, waiting
    // for nothing the first holds.
    tokio::time::timeout(DEADLINE, second.batch_execute(&toggle("9")))
        .await
        .expect("the second writer waits for no lock of the first")
        .unwrap();
    first.batch_execute("COMMIT").await.unwrap();
    let (one, two) = (before + 1, before + 2);
    assert_eq!(heard(&mut listener, 2).await, [one, two]);
    let (entries, history) = stamps(&dba, before).await;
    assert_eq!(
        (entries, history),
        (
            vec![("8842".to_string(), two), ("9".to_string(), one)],
            vec![("9".to_string(), one), ("8842".to_string(), two)]
        )
    );

    // Nested: the inner savepoint's failure leaves the outer one's change and the next alone.
    first
        .batch_execute(&format!(
            "BEGIN; SAVEPOINT a; {}; SAVEPOINT b;",
            toggle("8842")
        ))
        .await
        .unwrap();
    first.batch_execute(&toggle("7")).await.unwrap_err();
    first
        .batch_execute(&format!(
            "ROLLBACK TO SAVEPOINT b; {}; RELEASE a; COMMIT",
            toggle("9")
        ))
        .await
        .unwrap();
    let (three, four) = (two + 1, two + 2);
    assert_eq!(heard(&mut listener, 2).await, [three, four]);

    // A PL/pgSQL loop whose EXCEPTION block catches the first iteration's failure.
    first
        .batch_execute(
            "DO $$ DECLARE id text; BEGIN
               FOREACH id IN ARRAY ARRAY['7', '8842', '9'] LOOP
                 BEGIN
                   UPDATE shard_directory.shard_directory
                      SET region = CASE WHEN region IS NULL THEN 'eu' END WHERE entity_id = id;
                 EXCEPTION WHEN raise_exception THEN NULL;
                 END;
               END LOOP;
             END $$",
        )
        .await
        .unwrap();
    let (five, six) = (four + 1, four + 2);
    assert_eq!(heard(&mut listener, 2).await, [five, six]);
    let (entries, history) = stamps(&dba, four).await;
    let expected = vec![("8842".to_string(), five), ("9".to_string(), six)];
    assert_eq!((entries, history), (expected.clone(), expected));
    assert_eq!(version(&dba).await, six);
}

/// A move step takes its version at once, and with it the versions of its transaction's
/// earlier statements, in order. In a savepoint rolled back, those bumps are undone with the
/// step (their stamps, history and notifications too) and the earlier statements get their
/// versions at commit; in a savepoint released, they stay. Preloaded and not.
#[tokio::test]
async fn a_step_in_a_rolled_back_savepoint_leaves_the_earlier_statements_to_the_commit() {
    for settings in EITHER {
        step_in_a_savepoint(settings).await;
    }
}

async fn step_in_a_savepoint(settings: &[(&str, &str)]) {
    let (cluster, c) = directory_with(settings).await;
    c.batch_execute(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
         VALUES ('tenant', '9', 'shard_1')",
    )
    .await
    .unwrap();
    let mut listener = listening(&cluster).await;
    let step = "SELECT shard_directory.begin_move('tenant', '7', 'shard_2')";
    for release in [false, true] {
        let before = version(&c).await;
        c.batch_execute(&format!("BEGIN; {}; SAVEPOINT s", toggle("8842")))
            .await
            .unwrap();
        let stepped: i64 = c.query_one(step, &[]).await.unwrap().get(0);
        assert_eq!(stepped, before + 2, "after the earlier statement's version");
        let end = if release { "RELEASE" } else { "ROLLBACK TO" };
        c.batch_execute(&format!("{end} SAVEPOINT s; {}; COMMIT", toggle("9")))
            .await
            .unwrap();
        let (one, two, three) = (before + 1, before + 2, before + 3);
        let s = |id: &str, v: i64| (id.to_string(), v);
        let (entries, history) = stamps(&c, before).await;
        if release {
            assert_eq!(heard(&mut listener, 3).await, [one, two, three]);
            assert_eq!(entries, [s("7", two), s("8842", one), s("9", three)]);
            assert_eq!(history, [s("8842", one), s("7", two), s("9", three)]);
        } else {
            assert_eq!(heard(&mut listener, 2).await, [one, two]);
            assert_eq!(entries, [s("8842", one), s("9", two)]);
            assert_eq!(history, [s("8842", one), s("9", two)]);
        }
    }
}

/// A prepared transaction cannot notify, and a directory change gets its version at commit:
/// preparing a transaction that changed the directory is refused (0A000, saying so), whether
/// its change waits for the commit or a move step took its version already, and nothing of it
/// remains.
#[tokio::test]
async fn preparing_a_transaction_that_changed_the_directory_is_refused() {
    let (_cluster, c) = directory_with(&[("max_prepared_transactions", "2")]).await;
    let before = (version(&c).await, stamps(&c, 0).await);
    for change in [
        toggle("8842"),
        "SELECT shard_directory.freeze('tenant', '8842')".into(),
    ] {
        let e = c
            .batch_execute(&format!("BEGIN; {change}; PREPARE TRANSACTION 'p'"))
            .await
            .unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
        assert_eq!(
            db.code(),
            &SqlState::FEATURE_NOT_SUPPORTED,
            "{change}: {db}"
        );
        assert!(
            db.message()
                .contains("changed shard_directory.shard_directory cannot be prepared"),
            "{db}"
        );
        let prepared: i64 = c
            .query_one("SELECT count(*) FROM pg_prepared_xacts", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(prepared, 0);
    }
    assert_eq!((version(&c).await, stamps(&c, 0).await), before);
}

/// A column of the directory's tables altered by hand to another type is refused (42804,
/// naming it and its table, with the statement that gives its type back) before any row is
/// read or written raw: no crash (every session of the cluster would be ended), no pointer
/// stamped as a version. Each case is rolled back (a commit that fails rolls back); the
/// directory works afterwards.
#[tokio::test]
async fn a_column_altered_to_another_type_is_refused_before_it_is_read() {
    let (_cluster, c) = directory().await;
    const CHANGE: &str = "DELETE FROM shard_directory.shard_directory WHERE entity_id = '7'; \
        INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
        VALUES ('tenant', '7', 'shard_1')";
    for (table, column, to) in [
        ("shard_directory", "region", "integer USING NULL"),
        (
            "shard_directory",
            "entity_id",
            "bigint USING entity_id::bigint",
        ),
        ("shard_directory", "version", "numeric"),
        ("shard_directory_version", "version", "numeric"),
        ("shard_directory_history", "version", "numeric"),
        ("shard_directory_history", "changed_at", "timestamp"),
        ("shards", "shard_name", "varchar(8)"),
    ] {
        c.batch_execute(&format!(
            "BEGIN; ALTER TABLE shard_directory.{table} ALTER COLUMN {column} TYPE {to}"
        ))
        .await
        .unwrap_or_else(|e| panic!("{table}.{column}: {e}"));
        // Refused by the statement (the entry's own columns) or by its commit (the version and
        // history, written when the change gets its version).
        let e = c
            .batch_execute(&format!("{CHANGE}; COMMIT"))
            .await
            .expect_err(&format!("{table}.{column}"));
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
        assert_eq!(
            db.code(),
            &SqlState::DATATYPE_MISMATCH,
            "{table}.{column}: {db}"
        );
        assert!(
            db.message().contains(column)
                && db.message().contains(&format!("shard_directory.{table}")),
            "{}",
            db.message()
        );
        assert!(
            db.hint().is_some_and(|h| h.contains(&format!(
                "ALTER TABLE shard_directory.{table} ALTER COLUMN {column} TYPE"
            ))),
            "{:?}",
            db.hint()
        );
        c.batch_execute("ROLLBACK").await.unwrap();
    }
    let before = version(&c).await;
    c.batch_execute(CHANGE).await.unwrap();
    assert_eq!(version(&c).await, before + 2);
}

/// What a router and a DBA read from the directory: version, epoch, the keys `changes_since(0)`
/// reports, where tenant 8842 is.
async fn reads(c: &Client) -> (i64, String, Vec<String>, Option<String>) {
    let r = c
        .query_one(
            "SELECT shard_directory.current_version(), shard_directory.directory_epoch(), \
             (SELECT entity_ids FROM shard_directory.changes_since(0)), \
             shard_directory.placement_at('tenant', '8842', now())",
            &[],
        )
        .await
        .unwrap();
    let mut ids: Vec<String> = r.get(2);
    ids.sort();
    (r.get(0), r.get(1), ids, r.get(3))
}

/// Every read a router or a DBA makes works on a hot standby, with the primary's answers:
/// `current_version()` took a transaction id and failed there (XX000 "cannot assign
/// TransactionIds during recovery"), so a client pointed at a standby could not even connect.
#[tokio::test]
async fn every_directory_read_works_on_a_hot_standby() {
    let (primary, c) = directory().await;
    c.batch_execute(&toggle("8842")).await.unwrap();
    let v = version(&c).await;
    let on_primary = reads(&c).await;
    let standby = primary.standby("dir-standby");
    let s = standby.connect("directory").await;
    eventually("the standby to replay the change", DEADLINE, || async {
        (version(&s).await == v).then_some(())
    })
    .await;
    assert_eq!(reads(&s).await, on_primary);
}

/// A wait on the registry's lock on a shard.
const SHARD_LOCK: &str = "locktype = 'object' AND classid = 'shard_directory.shards'::regclass";

/// An entry written while its shard's region changes, or while its shard leaves the registry:
/// each side read the other under its own snapshot, and an `eu` entry committed on a shard just
/// turned `us`. Now whichever comes second waits for the first and is refused (23514 for the
/// region, 23503 for the removal), in either order, as it is when the two run one after the
/// other; no entry is left on a shard of another region or on no shard.
#[tokio::test]
async fn an_entry_and_its_shards_registry_change_at_once_cannot_both_commit() {
    let (cluster, dba) = directory().await;
    readme_roles(&dba).await;
    dba.batch_execute("GRANT DELETE ON shard_directory.shards TO dba")
        .await
        .unwrap();
    let insert = |id: &str, shard: &str| {
        format!(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name, region) \
             VALUES ('tenant', '{id}', '{shard}', 'eu')"
        )
    };
    let cases = [
        (
            "UPDATE shard_directory.shards SET region = 'us' WHERE shard_name = '{shard}'",
            SqlState::CHECK_VIOLATION,
        ),
        (
            "DELETE FROM shard_directory.shards WHERE shard_name = '{shard}'",
            SqlState::FOREIGN_KEY_VIOLATION,
        ),
    ];
    let mut n = 0;
    for (registry_change, refused_with) in cases {
        for registry_first in [true, false] {
            n += 1;
            let shard = format!("race_{n}");
            dba.batch_execute(&format!(
                "INSERT INTO shard_directory.shards (shard_name, region) VALUES ('{shard}', 'eu')"
            ))
            .await
            .unwrap();
            let registry_change = registry_change.replace("{shard}", &shard);
            let insert = insert(&format!("eu-{n}"), &shard);
            // A writer adds the entry, a DBA changes the registry: the documented roles, nothing more.
            let ((first_role, first_sql), (second_role, second_sql)) = if registry_first {
                (("dba", registry_change), ("directory_writer", insert))
            } else {
                (("directory_writer", insert), ("dba", registry_change))
            };
            let first = connect_as(&cluster, first_role).await;
            let second = connect_as(&cluster, second_role).await;
            let second_pid = pid(&second).await;
            first
                .batch_execute(&format!("BEGIN; {first_sql}"))
                .await
                .unwrap();
            let racer = tokio::spawn(async move { second.batch_execute(&second_sql).await });
            blocked_on(
                &dba,
                second_pid,
                SHARD_LOCK,
                "the second side to wait for the first on the shard's lock",
            )
            .await;
            first.batch_execute("COMMIT").await.unwrap();
            let refused = tokio::time::timeout(DEADLINE, racer)
                .await
                .expect("the second side finishes")
                .unwrap()
                .unwrap_err();
            assert_eq!(refused.code(), Some(&refused_with), "{refused}");
        }
    }
    let misplaced: i64 = dba
        .query_one(
            "SELECT count(*) FROM shard_directory.shard_directory d \
             LEFT JOIN shard_directory.shards s USING (shard_name) \
             WHERE s.shard_name IS NULL OR d.region <> s.region",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(misplaced, 0);
}

/// `session_replication_role = replica` (a superuser's setting, and every logical replication
/// worker's) keeps the directory's ordinary triggers from firing: a change went through
/// unchecked, unversioned and unrecorded. A change of any of the directory's tables is refused
/// there (0A000, naming the table and the setting) and changes nothing.
#[tokio::test]
async fn a_change_with_replication_role_replica_is_refused() {
    let (_cluster, c) = directory().await;
    let before = (version(&c).await, stamps(&c, 0).await);
    for (table, change) in [
        ("shard_directory", toggle("8842")),
        (
            "shard_directory_version",
            "UPDATE shard_directory.shard_directory_version SET version = version + 1".into(),
        ),
        (
            "shard_directory_history",
            "DELETE FROM shard_directory.shard_directory_history".into(),
        ),
    ] {
        let e = c
            .batch_execute(&format!(
                "BEGIN; SET LOCAL session_replication_role = replica; {change}"
            ))
            .await
            .unwrap_err();
        let db = e.as_db_error().unwrap();
        assert_eq!(db.code(), &SqlState::FEATURE_NOT_SUPPORTED, "{db}");
        assert!(
            db.message()
                .contains(&format!("shard_directory.{table} cannot be written"))
                && db.message().contains("session_replication_role = replica"),
            "{db}"
        );
        c.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!((version(&c).await, stamps(&c, 0).await), before);
}
