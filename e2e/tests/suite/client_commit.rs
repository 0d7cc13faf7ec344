//! What a router reports committed was committed: PostgreSQL answers the COMMIT of an aborted
//! transaction with ROLLBACK, not an error, so a closure that caught its own statement's error
//! and returned `Ok` gets `Error::Aborted`, as does one that ended the transaction itself; and
//! the router's COMMIT leaves its connection idle, whether it committed, was refused or failed.
//! `client_commit_edges` takes it off these paths.

use std::time::Duration;

use shard_directory_client::{AbortCause, EntityKey, Error, Router, ShardConfig};
use shard_directory_e2e::{eventually, Topology};
use tokio_postgres::error::SqlState;

const DEADLINE: Duration = Duration::from_secs(15);
/// The application name of the router under test's connections.
pub(crate) const APP: &str = "router under test";
pub(crate) const ORDER: &str = "INSERT INTO orders (tenant_id, item) VALUES ('1', $1)";

/// A router with one pooled connection per shard, named `APP`, so a test sees the state that
/// connection is left in.
pub(crate) async fn one_connection_router(t: &Topology) -> Router {
    let directory = t.client_directory(Default::default()).await;
    let shards = t.shard_configs().into_iter().map(|(name, mut config)| {
        config.application_name(APP);
        let mut shard = ShardConfig::new(name, config);
        shard.pool_size = 1;
        shard
    });
    Router::new(directory, shards).expect("router")
}

/// The states (pg_stat_activity) of the router's connections, seen from `observer`.
pub(crate) async fn router_states(observer: &tokio_postgres::Client) -> Vec<String> {
    observer
        .query(
            "SELECT coalesce(state, '?') FROM pg_stat_activity WHERE application_name = $1",
            &[&APP],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Waits until the router's connection to `shard` is idle, not in a transaction.
pub(crate) async fn left_idle(t: &Topology, shard: &str) {
    let observer = t.shard(shard).await;
    eventually("the router's connection to be idle", DEADLINE, || async {
        (router_states(&observer).await == ["idle"]).then_some(())
    })
    .await;
}

/// Whether `err` is `Error::Aborted` for `cause`.
pub(crate) fn aborted_by(err: &Error, cause: AbortCause) -> bool {
    matches!(err, Error::Aborted { cause: c, .. } if *c == cause)
}

pub(crate) fn tenant() -> EntityKey {
    EntityKey::new("tenant", "1")
}

#[tokio::test]
async fn a_closure_that_caught_its_statements_error_is_told_nothing_committed() {
    let t = Topology::start("commit-caught").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;

    let err = router
        .run(&tenant(), async |tx| {
            tx.execute(ORDER, &[&"before the error"]).await?;
            // The application catches the error and goes on: the transaction is aborted.
            let caught = tx.execute("SELECT 1 / 0", &[]).await.unwrap_err();
            assert_eq!(caught.code(), Some(&SqlState::DIVISION_BY_ZERO));
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Aborted { shard, cause: AbortCause::CaughtError, .. }
            if shard == "shard_1"),
        "{err:?}"
    );
    assert!(!err.is_retryable(), "the closure chose to go on: {err}");
    assert!(err.to_string().contains("nothing was committed"), "{err}");
    assert_eq!(t.orders("shard_1", "1").await, Vec::<String>::new());
    left_idle(&t, "shard_1").await;

    // A read whose closure swallowed an error is not answered as if it had run either.
    let err = router
        .read(&tenant(), async |tx| {
            let _ = tx.query("SELECT * FROM no_such_table", &[]).await;
            Ok::<_, Error>(0)
        })
        .await
        .unwrap_err();
    assert!(aborted_by(&err, AbortCause::CaughtError), "{err:?}");

    // The connection is clean for the next transaction.
    Topology::order(&router, "1", "after").await.unwrap();
    assert_eq!(t.orders("shard_1", "1").await, ["after"]);
    left_idle(&t, "shard_1").await;
}

#[tokio::test]
async fn a_closure_that_ended_the_transaction_itself_is_told_so() {
    let t = Topology::start("commit-ended").await;
    t.add_tenant("1", "shard_1").await;
    let router = one_connection_router(&t).await;

    let err = router
        .run(&tenant(), async |tx| {
            tx.execute(ORDER, &[&"committed by the closure"]).await?;
            tx.batch_execute("COMMIT").await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(aborted_by(&err, AbortCause::EndedByTheClosure), "{err:?}");
    assert!(!err.is_retryable());
    // What the closure committed stays, once: the closure was not re-run.
    assert_eq!(t.orders("shard_1", "1").await, ["committed by the closure"]);
    left_idle(&t, "shard_1").await;

    // Going on after its own COMMIT, the closure's next write is unstamped and refused
    // (`missing`): re-running it would commit its first part again.
    let runs = std::sync::atomic::AtomicUsize::new(0);
    let err = router
        .run(&tenant(), async |tx| {
            runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tx.execute(ORDER, &[&"committed, then went on"]).await?;
            tx.batch_execute("COMMIT").await?;
            tx.execute(ORDER, &[&"unstamped"]).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(aborted_by(&err, AbortCause::EndedByTheClosure), "{err:?}");
    assert_eq!(runs.into_inner(), 1, "not re-run");
    assert_eq!(
        t.orders("shard_1", "1").await,
        ["committed by the closure", "committed, then went on"]
    );
    left_idle(&t, "shard_1").await;

    let err = router
        .run(&tenant(), async |tx| {
            tx.execute(ORDER, &[&"rolled back by the closure"]).await?;
            tx.batch_execute("ROLLBACK").await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(aborted_by(&err, AbortCause::EndedByTheClosure), "{err:?}");
    assert_eq!(
        t.orders("shard_1", "1").await,
        ["committed by the closure", "committed, then went on"]
    );
    left_idle(&t, "shard_1").await;
}

#[tokio::test]
async fn the_routers_commit_leaves_its_connection_idle_when_it_commits_and_when_it_fails() {
    let t = Topology::start("commit-idle").await;
    t.add_tenant("1", "shard_1").await;
    t.on_every_shard(
        "CREATE TABLE tenants (tenant_id text PRIMARY KEY);
         CREATE TABLE receipts (tenant_id text NOT NULL REFERENCES tenants
             DEFERRABLE INITIALLY DEFERRED, item text NOT NULL);",
    )
    .await;
    let router = one_connection_router(&t).await;

    for i in 0..20 {
        Topology::order(&router, "1", &format!("order {i:02}"))
            .await
            .unwrap();
    }
    assert_eq!(t.orders("shard_1", "1").await.len(), 20);
    left_idle(&t, "shard_1").await;

    // A COMMIT that fails (a deferred foreign key) is the server's error, and ends the
    // transaction: nothing of it stays, nothing is sent after it (no "there is no transaction
    // in progress" WARNING in the shard's log), and the connection serves the next one.
    let warnings = || {
        t.shard_cluster("shard_1")
            .server_log()
            .matches("there is no transaction in progress")
            .count()
    };
    let before = warnings();
    let err = router
        .run(&tenant(), async |tx| {
            tx.execute(ORDER, &[&"with a receipt"]).await?;
            tx.execute(
                "INSERT INTO receipts (tenant_id, item) VALUES ('1', 'no tenant row')",
                &[],
            )
            .await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    let Error::Db(db) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(db.code(), Some(&SqlState::FOREIGN_KEY_VIOLATION), "{db:?}");
    assert!(!t
        .orders("shard_1", "1")
        .await
        .contains(&"with a receipt".to_owned()));
    left_idle(&t, "shard_1").await;
    Topology::order(&router, "1", "after the failed commit")
        .await
        .unwrap();
    assert_eq!(t.orders("shard_1", "1").await.len(), 21);
    left_idle(&t, "shard_1").await;
    assert_eq!(warnings(), before, "a WARNING after the failed COMMIT");
}
