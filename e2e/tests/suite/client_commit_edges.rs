//! The router's COMMIT off the paths `client_commit` takes: a busy application, a pooler in
//! transaction mode, a shard's idle-in-transaction timeout, a COMMIT that runs out of time, SERIALIZABLE, savepoints, closures that touch the stamp's settings, a migrating read,
//! and a frozen write whose directory stops answering. What `run` reports is what happened on
//! the shard, and the pooled connection is left as the next transaction needs it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shard_directory_client::{
    AbortCause, Error, Reads, RetryPolicy, Router, ShardConfig, State, TxOptions,
};
use shard_directory_e2e::{eventually, reaches, Topology};
use tokio_postgres::error::SqlState;
use tokio_postgres::IsolationLevel;

use super::client_commit::{
    aborted_by, left_idle, one_connection_router, router_states, tenant, APP, ORDER,
};

const DEADLINE: Duration = Duration::from_secs(15);

/// Watches the router's connections to a shard from a thread (and runtime) of its own, while
/// this test's thread is blocked in `join`: as an application whose runtime is busy (a
/// CPU-bound handler, a blocking call) right after `run` returned. Polls until `done` holds or
/// `deadline` passes; returns the last states seen.
fn watch_while_the_application_is_busy(
    config: tokio_postgres::Config,
    deadline: Duration,
    done: fn(&[String]) -> bool,
) -> Vec<String> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let (observer, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let started = Instant::now();
            loop {
                let states = router_states(&observer).await;
                if done(&states) || started.elapsed() > deadline {
                    return states;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    })
    .join()
    .expect("the watching thread")
}

fn shard_1_config(t: &Topology) -> tokio_postgres::Config {
    t.shard_configs()
        .into_iter()
        .find(|(n, _)| n == "shard_1")
        .unwrap()
        .1
}

/// `Ok` from `run` means the transaction is over on the shard: nothing the router sends after
/// it is left queued for the application's runtime to send, so the router's backend is idle
/// even while the application is busy (checked to fail when the COMMIT opened a transaction
/// for the dropped `Transaction`'s ROLLBACK to end).
#[tokio::test(flavor = "current_thread")]
async fn a_committed_run_leaves_no_transaction_open_on_the_shard() {
    let t = Topology::start("commit-open-after-ok").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;
    Topology::order(&router, "1", "warm up").await.unwrap();
    left_idle(&t, "shard_1").await;

    Topology::order(&router, "1", "committed").await.unwrap();
    // Nothing is awaited between `run`'s Ok and this look.
    let states =
        watch_while_the_application_is_busy(shard_1_config(&t), Duration::from_secs(3), |s| {
            s == ["idle"]
        });
    assert_eq!(
        states,
        ["idle"],
        "after run() returned Ok, the router's backend is still in a transaction"
    );
    assert_eq!(t.orders("shard_1", "1").await, ["committed", "warm up"]);
}

/// A shard with `idle_in_transaction_session_timeout` (a common production guard): nothing
/// the router's COMMIT leaves open outlives the stamp's local timeout, so the server does not
/// terminate the pooled connection while the application is busy, and the next `run` works.
#[tokio::test(flavor = "current_thread")]
async fn a_shards_idle_in_transaction_timeout_does_not_kill_the_pooled_connection_after_a_commit() {
    let t = Topology::configured(
        "commit-idle-timeout",
        &[&[("idle_in_transaction_session_timeout", "300ms")], &[]],
    )
    .await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;
    Topology::order(&router, "1", "warm up").await.unwrap();
    left_idle(&t, "shard_1").await;
    let log_before = t.shard_cluster("shard_1").server_log();

    Topology::order(&router, "1", "committed").await.unwrap();
    // Busy for a while (until the connection is either idle or gone, at most 3 s).
    let states =
        watch_while_the_application_is_busy(shard_1_config(&t), Duration::from_secs(3), |s| {
            s.is_empty() || s == ["idle"]
        });
    let next = Topology::order(&router, "1", "next").await;
    let log = t.shard_cluster("shard_1").server_log();
    let killed = log[log_before.len().min(log.len())..]
        .matches("idle-in-transaction timeout")
        .count();
    assert!(
        states == ["idle"] && killed == 0 && next.is_ok(),
        "the router's connection after a commit: {states:?} (\"idle\" expected, [] = terminated); \
         terminations for idle-in-transaction timeout in the shard's log: {killed}; \
         the next run: {next:?}"
    );
}

/// A closure that stamps the transaction itself with another valid version (its own helper,
/// from before it used the router): the shard accepts its write, the router's COMMIT commits
/// it, and `run` says so; the closure did not end the transaction.
#[tokio::test]
async fn a_closure_that_restamps_the_transaction_is_not_told_it_ended_it() {
    let t = Topology::start("commit-restamp").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;

    let result = router
        .run(&tenant(), async |tx| {
            tx.execute(
                "SELECT set_config('app.directory_version', \
                    (current_setting('app.directory_version')::bigint + 1)::text, true)",
                &[],
            )
            .await?;
            tx.execute(ORDER, &[&"restamped"]).await?;
            Ok::<_, Error>(())
        })
        .await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(t.orders("shard_1", "1").await, ["restamped"]);
    left_idle(&t, "shard_1").await;
}

/// A closure that runs `RESET ALL` (undoing its own `SET LOCAL work_mem`, say) clears the
/// stamp's settings too, but has not ended the transaction: its write is committed, and `run`
/// says so.
#[tokio::test]
async fn a_closure_that_resets_its_settings_is_not_told_nothing_it_did_stays_uncommitted() {
    let t = Topology::start("commit-reset-all").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;

    let result = router
        .run(&tenant(), async |tx| {
            tx.batch_execute("SET LOCAL work_mem = '64MB'").await?;
            tx.execute(ORDER, &[&"before the reset"]).await?;
            tx.batch_execute("RESET ALL").await?;
            Ok::<_, Error>(())
        })
        .await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(t.orders("shard_1", "1").await, ["before the reset"]);
    left_idle(&t, "shard_1").await;
}

/// SERIALIZABLE: the closure's transaction is made a pivot by another that commits first
/// (write skew), so its COMMIT fails with a plain 40001. Nothing of it was committed: it is
/// re-run, committed once, and the connection is idle.
#[tokio::test]
async fn a_serialization_failure_at_commit_is_rerun_and_commits_once() {
    let t = Topology::start("commit-serializable").await;
    t.add_tenant("1", "shard_1").await;
    t.on_every_shard("CREATE TABLE ledger (note text)").await;
    let router = one_connection_router(&t).await;
    let other = t.shard("shard_1").await;
    let runs = AtomicUsize::new(0);
    let failed_commit_seen = AtomicUsize::new(0);

    let options = TxOptions::default().isolation(IsolationLevel::Serializable);
    router
        .run_with(&tenant(), options, async |tx| {
            let run = runs.fetch_add(1, Ordering::SeqCst);
            tx.query("SELECT count(*) FROM ledger", &[]).await?;
            tx.execute(ORDER, &[&"serializable"]).await?;
            if run == 0 {
                // Another serializable transaction reads what this one wrote and writes what
                // it read, and commits first.
                other
                    .batch_execute(
                        "BEGIN ISOLATION LEVEL SERIALIZABLE;
                         SELECT count(*) FROM orders WHERE tenant_id = '1';
                         INSERT INTO ledger VALUES ('skew');
                         COMMIT",
                    )
                    .await
                    .expect("the other transaction commits first");
                failed_commit_seen.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert_eq!(failed_commit_seen.into_inner(), 1);
    assert_eq!(runs.into_inner(), 2, "re-run once after the COMMIT's 40001");
    assert_eq!(t.orders("shard_1", "1").await, ["serializable"]);
    left_idle(&t, "shard_1").await;
    Topology::order(&router, "1", "after").await.unwrap();
    assert_eq!(t.orders("shard_1", "1").await, ["after", "serializable"]);
}

/// A closure that catches its statement's error inside a savepoint and rolls back to it: the
/// transaction is not aborted, so it commits (what came before and after the savepoint), once.
#[tokio::test]
async fn a_closure_that_recovers_with_a_savepoint_commits() {
    let t = Topology::start("commit-savepoint").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;

    router
        .run(&tenant(), async |tx| {
            tx.execute(ORDER, &[&"before the savepoint"]).await?;
            tx.batch_execute("SAVEPOINT a").await?;
            tx.execute(ORDER, &[&"rolled back to the savepoint"])
                .await?;
            let caught = tx.execute("SELECT 1 / 0", &[]).await.unwrap_err();
            assert_eq!(caught.code(), Some(&SqlState::DIVISION_BY_ZERO));
            tx.batch_execute("ROLLBACK TO SAVEPOINT a").await?;
            tx.execute(ORDER, &[&"after the savepoint"]).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert_eq!(
        t.orders("shard_1", "1").await,
        ["after the savepoint", "before the savepoint"]
    );
    left_idle(&t, "shard_1").await;

    // Aborted inside a savepoint and not rolled back to it: nothing committed.
    let err = router
        .run(&tenant(), async |tx| {
            tx.execute(ORDER, &[&"in the aborted transaction"]).await?;
            tx.batch_execute("SAVEPOINT b").await?;
            let _ = tx.execute("SELECT 1 / 0", &[]).await;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(aborted_by(&err, AbortCause::CaughtError), "{err:?}");
    assert_eq!(t.orders("shard_1", "1").await.len(), 2);
    left_idle(&t, "shard_1").await;
    Topology::order(&router, "1", "next").await.unwrap();
    assert_eq!(t.orders("shard_1", "1").await.len(), 3);
}

/// The attempt's time runs out in the router's COMMIT (a deferred trigger that takes longer):
/// the error says so and is not retryable (the outcome is unknown to the router), and on the
/// shard nothing of it is committed nor left running; the next transaction works.
/// Timing: the closure spends 300 ms first, so the client's bound fires 300 ms before the
/// server's statement_timeout would.
#[tokio::test]
async fn an_attempt_that_runs_out_of_time_in_commit_says_so_and_commits_nothing() {
    let t = Topology::start("commit-commit-timeout").await;
    t.add_tenant("1", "shard_1").await;
    t.on_every_shard(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(5); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON orders DEFERRABLE INITIALLY DEFERRED
             FOR EACH ROW WHEN (NEW.item = 'slow') EXECUTE FUNCTION slow_commit();",
    )
    .await;
    let bound = Duration::from_millis(1500);
    let router = one_connection_router(&t).await.with_retry(
        RetryPolicy::default()
            .deadline(bound)
            .attempt_timeout(bound),
    );
    Topology::order(&router, "1", "warm up").await.unwrap();

    let err = router
        .run(&tenant(), async |tx| {
            tx.execute("SELECT pg_sleep(0.3)", &[]).await?;
            tx.execute(ORDER, &[&"slow"]).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::ShardTimeout { step: "commit", .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable(), "{err}");
    let observer = t.shard("shard_1").await;
    eventually(
        "the abandoned COMMIT to be gone from the shard",
        DEADLINE,
        || async {
            let states = router_states(&observer).await;
            (states.is_empty() || states == ["idle"]).then_some(())
        },
    )
    .await;
    assert_eq!(t.orders("shard_1", "1").await, ["warm up"]);
    Topology::order(&router, "1", "after").await.unwrap();
    assert_eq!(t.orders("shard_1", "1").await, ["after", "warm up"]);
    left_idle(&t, "shard_1").await;
}

/// While `migrating`, a read runs on both shards, each ended by the router's COMMIT: both
/// answers come back, and both pooled connections are idle and serve the next read and write.
#[tokio::test]
async fn a_read_of_a_migrating_entity_leaves_both_connections_idle() {
    let t = Topology::start("commit-migrating-read").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;
    Topology::order(&router, "1", "on the source")
        .await
        .unwrap();
    let v = t
        .step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    reaches(router.directory(), v).await;
    let count = async |tx: &tokio_postgres::Transaction<'_>| -> Result<i64, Error> {
        Ok(tx
            .query_one("SELECT count(*) FROM orders WHERE tenant_id = '1'", &[])
            .await?
            .get(0))
    };
    for read in 0..3 {
        let reads = if read % 2 == 0 {
            router.read(&tenant(), count).await.unwrap()
        } else {
            router.read_unchecked(&tenant(), count).await.unwrap()
        };
        assert_eq!(
            reads,
            Reads::Both {
                source: 1,
                target: 0
            }
        );
        left_idle(&t, "shard_1").await;
        left_idle(&t, "shard_2").await;
    }
    // A read whose closure caught an error on the target: reported, nothing left open.
    let runs = AtomicUsize::new(0);
    let err = router
        .read(&tenant(), async |tx| {
            if runs.fetch_add(1, Ordering::SeqCst) == 1 {
                let _ = tx.query("SELECT * FROM no_such_table", &[]).await;
            }
            Ok::<_, Error>(0)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Aborted { shard, cause: AbortCause::CaughtError, .. }
            if shard == "shard_2"),
        "{err:?}"
    );
    left_idle(&t, "shard_1").await;
    left_idle(&t, "shard_2").await;
    Topology::order(&router, "1", "during the copy")
        .await
        .unwrap();
    assert_eq!(
        t.orders("shard_1", "1").await,
        ["during the copy", "on the source"]
    );
}

/// A write waiting out a freeze while the directory stops answering (SIGSTOP): it fails with
/// `ReadOnly` at the deadline, not before it (the change) and not long after it (a directory
/// that does not answer must not hold it).
#[tokio::test]
async fn a_frozen_write_gives_up_at_the_deadline_when_the_directory_stops_answering() {
    let t = Topology::start("commit-frozen-deadline").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;
    let deadline = Duration::from_millis(2500);
    let router = router.with_retry(
        RetryPolicy::default()
            .deadline(deadline)
            .max_backoff(Duration::from_secs(2)),
    );
    Topology::order(&router, "1", "before").await.unwrap();
    t.step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    let v = t.step("SELECT shard_directory.freeze('tenant', '1')").await;
    reaches(router.directory(), v).await;
    // The client has read the frozen entry before the directory stops answering.
    assert_eq!(
        router
            .directory()
            .lookup("tenant", "1")
            .await
            .unwrap()
            .state,
        State::ReadOnly
    );

    let frozen = t.directory.freeze();
    let started = Instant::now();
    let err = tokio::time::timeout(DEADLINE, Topology::order(&router, "1", "frozen"))
        .await
        .expect("the write ends")
        .unwrap_err();
    let took = started.elapsed();
    drop(frozen);
    assert!(matches!(err, Error::ReadOnly(_)), "after {took:?}: {err:?}");
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(1),
        "gave up after {took:?}, deadline {deadline:?}"
    );
    assert_eq!(t.orders("shard_1", "1").await, ["before"]);
}

/// Behind PgBouncer in transaction mode (one server connection, the stamp unnamed): once `run`
/// returns `Ok` the server connection is back with the pooler, and another of its clients is
/// answered while this application is busy.
#[tokio::test(flavor = "current_thread")]
async fn behind_a_transaction_pooler_a_committed_run_hands_its_server_connection_back() {
    use shard_directory_client::Statements;
    use shard_directory_e2e::pgbouncer::PgBouncer;
    let t = Topology::start("commit-pgbouncer").await;
    t.add_tenant("1", "shard_1").await;
    let bouncer = PgBouncer::start(t.shard_cluster("shard_1"), 1).await;
    let directory = t.client_directory(Default::default()).await;
    let mut through = bouncer.config("app");
    through.application_name(APP);
    let mut shard = ShardConfig::new("shard_1", through).statements(Statements::Unnamed);
    shard.pool_size = 1;
    let router = Router::new(directory, [shard]).expect("router");
    Topology::order(&router, "1", "warm up").await.unwrap();
    // Lets the runtime send whatever the last transaction left queued.
    Topology::order(&router, "1", "warm up again")
        .await
        .unwrap();
    tokio::task::yield_now().await;

    Topology::order(&router, "1", "committed").await.unwrap();
    // Another client of the pooler, while this application is busy.
    let other = bouncer.config("app");
    let answered = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let started = Instant::now();
            let asked = async {
                let (c, connection) = other.connect(tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(connection);
                c.query_one("SELECT 1", &[]).await.unwrap();
            };
            tokio::time::timeout(Duration::from_secs(3), asked)
                .await
                .map(|_| started.elapsed())
        })
    })
    .join()
    .expect("the other client's thread");
    assert!(
        answered.is_ok(),
        "another client of the pooler got no server connection within 3 s after run() returned \
         Ok: the router's client still held it in a transaction"
    );
    assert_eq!(t.orders("shard_1", "1").await.len(), 3);
}
