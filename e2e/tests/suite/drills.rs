//! Outage drills: the directory stopped while traffic flows, one shard stopped, the watcher's
//! connection killed during a move, and the mover killed during the freeze. Each runs real
//! traffic through routers and ends by checking that no acknowledged write was lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_client::{
    DirectoryConfig, EntityKey, Error, RetryPolicy, Router, WATCHER_APPLICATION_NAME,
};
use shard_directory_e2e::workload::{write_order, Audit, Ledger, Workload};
use shard_directory_e2e::{eventually, mover_cli, reaches, Topology};
use shard_directory_mover::Phase;

const DEADLINE: Duration = Duration::from_secs(20);

/// Acknowledged writes of `tenant` in the workload so far.
fn acked(w: &Workload, tenant: &str) -> usize {
    w.ledger().acked.values().filter(|t| *t == tenant).count()
}

/// Stops the workload and checks that every acknowledged order is where the directory says.
async fn audited(t: &Topology, w: Workload) -> Ledger {
    let ledger = w.stop().await;
    let audit = Audit::of(t, &ledger).await;
    assert!(audit.holds(), "{}", audit.problems());
    assert!(ledger.fatal.is_empty(), "{:?}", ledger.fatal);
    ledger
}

#[tokio::test]
async fn the_directory_stopped_under_traffic_serves_active_tenants_fails_a_moving_one_closed_and_converges(
) {
    let t = Topology::start("drill-dir").await;
    t.add_tenant("a", "shard_1").await;
    t.add_tenant("b", "shard_2").await;
    t.add_tenant("m", "shard_1").await;
    let begun = t
        .step("SELECT shard_directory.begin_move('tenant', 'm', 'shard_2')")
        .await;
    let mut routers = Vec::new();
    for _ in 0..2 {
        let d = t.client_directory(DirectoryConfig::default()).await;
        reaches(&d, begun).await;
        routers.push(Arc::new(t.router(d)));
    }
    let w = Workload::start(
        &routers,
        &["a", "b", "m"],
        2,
        Duration::from_millis(5),
        fastrand::u64(..),
        Ledger::default(),
    );
    eventually("writes for every tenant", DEADLINE, || async {
        ["a", "b", "m"]
            .iter()
            .all(|x| acked(&w, x) >= 5)
            .then_some(())
    })
    .await;
    // A router serves from cache only what it has cached: the workload picks tenants at random,
    // so one router may not have routed a given tenant yet.
    for r in &routers {
        for x in ["a", "b", "m"] {
            r.directory().lookup("tenant", x).await.expect("cached");
        }
    }

    t.directory.stop();
    for r in &routers {
        eventually("the watcher to notice", DEADLINE, || async {
            (!r.directory().is_connected()).then_some(())
        })
        .await;
    }
    let (a, b) = (acked(&w, "a"), acked(&w, "b"));
    let m_failed = w.ledger().failures_of("m");
    eventually(
        "the active tenants served and the moving one failed closed during the outage",
        DEADLINE,
        || async {
            (acked(&w, "a") >= a + 20
                && acked(&w, "b") >= b + 20
                && w.ledger().failures_of("m") >= m_failed + 5)
                .then_some(())
        },
    )
    .await;
    for r in &routers {
        assert!(
            r.directory().stats().serving_stale > 0,
            "stale serves are counted"
        );
    }

    t.directory.restart();
    let done = t
        .step("SELECT shard_directory.abort_move('tenant', 'm')")
        .await;
    for r in &routers {
        reaches(r.directory(), done).await;
    }
    let m = acked(&w, "m");
    eventually("the moving tenant writable again", DEADLINE, || async {
        (acked(&w, "m") > m).then_some(())
    })
    .await;
    let ledger = audited(&t, w).await;
    // Every failure was the moving tenant's, and closed by the policy.
    assert!(
        ledger
            .failed
            .iter()
            .chain(&ledger.failed_reads)
            .all(|((tenant, kind), _)| tenant == "m" && kind == "FailClosed"),
        "{:?} {:?}",
        ledger.failed,
        ledger.failed_reads
    );
}

#[tokio::test]
async fn a_mover_killed_during_the_freeze_leaves_the_tenant_writable_after_resume_or_abort() {
    let t = Topology::start("drill-mover").await;
    let mut ledger = Ledger::default();
    for tenant in ["r", "x"] {
        t.add_tenant(tenant, "shard_1").await;
        // Enough rows that the copy under the freeze outlasts the kill's polling.
        for item in t.seed_orders("shard_1", tenant, 10_000, 1).await {
            ledger.acked.insert(item, tenant.into());
        }
    }
    let d = t.client_directory(DirectoryConfig::default()).await;
    let routers = [Arc::new(t.router(d.clone()))];
    let w = Workload::start(
        &routers,
        &["r", "x"],
        2,
        Duration::from_millis(5),
        fastrand::u64(..),
        ledger,
    );
    let impatient = t
        .router(d)
        .with_retry(RetryPolicy::default().deadline(Duration::from_secs(1)));

    for (tenant, verb, lands_on) in [("r", "resume", "shard_2"), ("x", "abort", "shard_1")] {
        let killed =
            mover_cli::kill_at(&t, tenant, "shard_2", "copy", Phase::Frozen, Duration::ZERO)
                .await
                .expect("the move was still running when killed");
        let stopped_at = killed.stopped_at.expect("the killed move is open");
        assert!(
            (Phase::Frozen..Phase::Cutover).contains(&stopped_at),
            "killed in the freeze, not at {stopped_at}"
        );
        // Nobody is left to end the freeze: the tenant's writes are refused ...
        let err = write_order(&impatient, tenant, &format!("{tenant} frozen"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::ReadOnly(_) | Error::Rejected { .. }),
            "{err:?}"
        );
        // ... until the operator runs the CLI, and nothing else.
        mover_cli::finish(&t, verb, killed.move_id).await;
        assert_eq!(t.placement(tenant).await, lands_on);
        let before = acked(&w, tenant);
        eventually("the tenant writable again", DEADLINE, || async {
            (acked(&w, tenant) > before).then_some(())
        })
        .await;
    }
    let ledger = audited(&t, w).await;
    assert!(ledger.acked.len() > 20_000, "the writers kept writing");
}

async fn insert(router: &Router, id: &str, item: &str) -> Result<(), Error> {
    let (id, item) = (id.to_owned(), item.to_owned());
    router
        .run(&EntityKey::new("tenant", id.clone()), async move |tx| {
            tx.execute("INSERT INTO orders VALUES ($1, $2)", &[&id, &item])
                .await?;
            Ok(())
        })
        .await
}

#[tokio::test]
async fn a_stopped_shard_fails_only_its_tenants_with_an_error_naming_it() {
    let t = Topology::start("drill-shard").await;
    t.add_tenant("1", "shard_1").await;
    t.add_tenant("2", "shard_2").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    let deadline = Duration::from_secs(2);
    let router = t
        .router(d)
        .with_retry(RetryPolicy::default().deadline(deadline));
    // Both shards in use: the pool to shard_2 holds a connection when it goes.
    insert(&router, "1", "before").await.unwrap();
    insert(&router, "2", "before").await.unwrap();

    t.shard_cluster("shard_2").stop();
    let started = Instant::now();
    let err = insert(&router, "2", "during").await.unwrap_err();
    assert!(
        started.elapsed() < deadline + Duration::from_secs(5),
        "gave up after {:?}",
        started.elapsed()
    );
    assert!(err.is_retryable(), "{err:?}");
    // The pooled connection died with the server: lost at BEGIN, so nothing was committed.
    assert!(
        matches!(
            &err,
            Error::ShardConnection { shard, step: "begin", .. }
                | Error::ShardUnavailable { shard, .. } if shard == "shard_2"
        ),
        "{err:?}"
    );
    assert!(
        format!("{err}").contains("shard_2"),
        "the error names the shard: {err}"
    );
    // The other shard's tenants carry on meanwhile.
    insert(&router, "1", "during").await.unwrap();

    t.shard_cluster("shard_2").restart();
    eventually(
        "shard_2 to take writes again",
        Duration::from_secs(15),
        || async { insert(&router, "2", "after").await.ok() },
    )
    .await;
    assert_eq!(t.orders("shard_1", "1").await, ["before", "during"]);
    assert_eq!(t.orders("shard_2", "2").await, ["after", "before"]);
}

#[tokio::test]
async fn a_watcher_killed_during_a_move_converges_within_the_poll_interval() {
    let t = Topology::start("drill-watcher").await;
    t.add_tenant("8842", "shard_1").await;
    let poll = Duration::from_secs(2);
    let d = t
        .client_directory(DirectoryConfig::default().poll_interval(poll))
        .await;
    let router = t.router(d.clone());
    insert(&router, "8842", "before").await.unwrap();

    // The watcher's connection goes mid-move: after the move began, before it ends.
    let begun = t
        .step("SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')")
        .await;
    reaches(&d, begun).await;
    let killed: i64 = t
        .dba()
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&WATCHER_APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1);
    let aborted = t
        .step("SELECT shard_directory.abort_move('tenant', '8842')")
        .await;
    let started = Instant::now();
    reaches(&d, aborted).await;
    assert!(
        started.elapsed() < poll + Duration::from_secs(5),
        "converged after {:?}",
        started.elapsed()
    );
    assert_eq!(d.lookup("tenant", "8842").await.unwrap().target_shard, None);
    insert(&router, "8842", "after").await.unwrap();
    assert_eq!(t.orders("shard_1", "8842").await, ["after", "before"]);
}
