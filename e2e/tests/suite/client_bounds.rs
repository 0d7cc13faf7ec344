//! Nothing loops, nothing hangs, nothing waits on a stale picture: a
//! refusal no refresh cures is returned at once, a write waiting out a freeze looks again, every
//! call to a shard and the watcher's connect end by their bounds, an abandoned statement is
//! cancelled, and a busy client is not taken for a directory outage.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_client::{
    Directory, DirectoryConfig, EntityKey, Error, Policy, Reads, RetryPolicy, Router, ShardConfig,
    State, Statements,
};
use shard_directory_e2e::pgbouncer::PgBouncer;
use shard_directory_e2e::proxy::Proxy;
use shard_directory_e2e::topology::{told_nothing, DIRECTORY_DB};
use shard_directory_e2e::workload::count_orders;
use shard_directory_e2e::{eventually, reaches, Topology};

const DEADLINE: Duration = Duration::from_secs(15);
const HOUR: Duration = Duration::from_secs(3600);

/// Order `w{i}` of tenant 1, after `first` (SQL), in a task of its own: the closure owns what it
/// uses, so the future is `Send`.
fn spawn_order(
    router: &Arc<Router>,
    i: usize,
    first: &'static str,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let router = router.clone();
    tokio::spawn(async move {
        let (item, first) = (format!("w{i}"), first.to_owned());
        router
            .run(&EntityKey::new("tenant", "1"), async move |tx| {
                tx.batch_execute(&first).await?;
                tx.execute(
                    "INSERT INTO orders (tenant_id, item) VALUES ('1', $1)",
                    &[&item],
                )
                .await?;
                Ok::<_, Error>(())
            })
            .await
    })
}

/// A shard whose minimum is above any version the directory has (a failover that lost
/// the directory's last changes leaves the same) refuses every route; a refresh cannot cure it.
/// Ten writes end at once with the shard's minimum and the directory's version, after a handful
/// of directory queries (the reported loop made 69,581 in 14.5 s). A refusal whose reason no
/// re-routing cures (`truncate_fenced`) is returned after one attempt.
#[tokio::test]
async fn a_refusal_no_refresh_cures_is_returned_at_once_saying_why() {
    let t = Topology::start("storm").await;
    t.add_tenant("1", "shard_1").await;
    let v = t.add_tenant("2", "shard_2").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    reaches(&d, v).await;
    let router = Arc::new(t.router(d.clone()));
    Topology::order(&router, "1", "before").await.unwrap();
    let minimum = v + 1000;
    t.shard("shard_1")
        .await
        .execute("SELECT shard_directory.raise_min_accepted($1)", &[&minimum])
        .await
        .unwrap();

    let queries = d.stats().store_queries;
    let started = Instant::now();
    let writes: Vec<_> = (0..10).map(|i| spawn_order(&router, i, "")).collect();
    for w in writes {
        let err = w.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, Error::DirectoryBehind { shard, minimum: m, directory_version, .. }
                if shard == "shard_1" && *m == minimum && *directory_version == v),
            "{err}"
        );
        assert!(!err.is_retryable(), "{err}");
    }
    let took = started.elapsed();
    let spent = d.stats().store_queries - queries;
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(
        spent <= 30,
        "{spent} directory queries for 10 refused writes"
    );
    assert_eq!(t.orders("shard_1", "1").await, ["before"]);

    // TRUNCATE of a table while one of its entities is fenced: 40001, but no route cures it.
    t.shard("shard_2")
        .await
        .execute(
            "SELECT shard_directory.fence_frozen('tenant', 'other')",
            &[],
        )
        .await
        .unwrap();
    let retries = d.stats().retries;
    let err = router
        .run(&EntityKey::new("tenant", "2"), async |tx| {
            tx.batch_execute("TRUNCATE orders, order_lines").await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    let Error::Db(db) = &err else {
        panic!("the closure's own error: {err}")
    };
    assert_eq!(
        db.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE)
    );
    assert_eq!(d.stats().rejections("other"), 1);
    assert_eq!(d.stats().retries, retries, "not retried");
}

/// A write finds its entity `read_only` in the cache, and the cutover has committed
/// before it began; the client is told nothing (no LISTEN, as behind a pooler, and an hourly
/// poll). While it waits it reads the entry again: the write lands on the target at once, not
/// after the retry deadline (it failed after 14.8 s).
#[tokio::test]
async fn a_write_waiting_out_a_freeze_looks_again_and_lands_after_the_cutover() {
    let t = Topology::start("freeze-wait").await;
    t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(told_nothing()).await;
    let router = t.router(d.clone());
    t.step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    t.step("SELECT shard_directory.freeze('tenant', '1')").await;
    d.refresh().await.unwrap();
    assert_eq!(
        d.lookup("tenant", "1").await.unwrap().state,
        State::ReadOnly
    );
    t.step("SELECT shard_directory.complete_move('tenant', '1')")
        .await;

    let started = Instant::now();
    Topology::order(&router, "1", "after the cutover")
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(t.orders("shard_2", "1").await, ["after the cutover"]);
}

/// A shard that stops answering (SIGSTOP) with a connection in the pool: the write's
/// BEGIN never returns. It fails when its attempt's time (here the deadline's) ends, saying
/// where it was (it was still pending after 25 s with a 15 s deadline); once the shard answers
/// again, so does the router.
#[tokio::test]
async fn a_shard_that_stops_answering_fails_the_write_at_the_deadline() {
    let t = Topology::start("stopped-shard").await;
    t.add_tenant("1", "shard_1").await;
    let deadline = Duration::from_secs(2);
    let router = t.connected_router().await.with_retry(
        RetryPolicy::default()
            .deadline(deadline)
            .attempt_timeout(deadline),
    );
    Topology::order(&router, "1", "before").await.unwrap();

    let frozen = t.shard_cluster("shard_1").freeze();
    let started = Instant::now();
    let err = tokio::time::timeout(DEADLINE, Topology::order(&router, "1", "never"))
        .await
        .expect("the write ends by its deadline")
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(1),
        "took {took:?}"
    );
    assert!(
        matches!(&err, Error::ShardTimeout { shard, step: "begin", .. } if shard == "shard_1"),
        "{err}"
    );
    assert!(err.is_retryable() && err.is_shard_unreachable());
    drop(frozen);
    Topology::order(&router, "1", "after").await.unwrap();
    assert_eq!(t.orders("shard_1", "1").await, ["after", "before"]);
}

/// A caller that gives up on a routed transaction (drops its future) while a statement
/// runs: the statement is cancelled on the shard, not left running until its end (here a
/// minute; the router's own bound would be the 15 s deadline) holding the check's lock.
#[tokio::test]
async fn a_transaction_the_caller_abandons_is_cancelled_on_the_shard() {
    let t = Topology::start("abandoned").await;
    t.add_tenant("1", "shard_1").await;
    let router = t.connected_router().await;
    let observer = t.shard("shard_1").await;
    let sleeping = async || {
        observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let key = EntityKey::new("tenant", "1");
    let run = router.run(&key, async |tx| {
        tx.batch_execute("SELECT pg_sleep(60)").await?;
        Ok::<_, Error>(())
    });
    tokio::select! {
        _ = run => panic!("pg_sleep(60) returned"),
        _ = eventually("the statement to run", DEADLINE, || async {
            (sleeping().await == 1).then_some(())
        }) => {}
    }
    // The transaction's future is dropped here.
    eventually(
        "the abandoned statement to be cancelled",
        Duration::from_secs(3),
        || async { (sleeping().await == 0).then_some(()) },
    )
    .await;
    // The check's lock is free: a fence change does not wait.
    tokio::time::timeout(
        Duration::from_secs(3),
        observer.execute("SELECT shard_directory.fence_frozen('tenant', '2')", &[]),
    )
    .await
    .expect("the fence change did not wait")
    .unwrap();
}

/// Waiting for a pool slot is part of the attempt, bounded by the retry deadline, not
/// by the connect timeout: a hundred transactions of a quarter second each on a pool of four
/// (6 s of work through 4 connections, past the 1 s connect timeout) all commit (32 of 100
/// failed as "shard unavailable" on a healthy shard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_transactions_share_a_pool_of_four() {
    let t = Topology::start("pool-of-four").await;
    t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    let shards = t.shard_configs().into_iter().map(|(name, config)| {
        ShardConfig::new(name, config)
            .pool_size(4)
            .connect_timeout(Duration::from_secs(1))
    });
    let router = Arc::new(Router::new(d, shards).unwrap());
    let writes: Vec<_> = (0..100)
        .map(|i| spawn_order(&router, i, "SELECT pg_sleep(0.06)"))
        .collect();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    assert_eq!(t.orders("shard_1", "1").await.len(), 100);
}

/// The watcher's connect has an overall bound, not only TCP's: behind a proxy that
/// accepts and never answers, each attempt gives up after the connect timeout, so once the proxy
/// forwards again the watcher is back within a second (it stayed disconnected for good).
#[tokio::test]
async fn a_watcher_behind_a_proxy_that_never_answers_connects_once_it_does() {
    let t = Topology::start("black-hole").await;
    t.add_tenant("1", "shard_1").await;
    let proxy = Proxy::black_hole(t.directory.port()).await;
    let through_proxy: tokio_postgres::Config = format!(
        "host=127.0.0.1 port={} user=postgres dbname={DIRECTORY_DB}",
        proxy.port()
    )
    .parse()
    .unwrap();
    let d = Directory::connect(
        t.directory_config(),
        DirectoryConfig::default()
            .listen_config(through_proxy)
            .connect_timeout(Duration::from_millis(500))
            .max_reconnect_backoff(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    // The store answers meanwhile: lookups go to it.
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    assert!(!d.is_connected());
    proxy.forward();
    eventually(
        "the watcher to connect through the proxy",
        Duration::from_secs(3),
        || async { d.is_connected().then_some(()) },
    )
    .await;
    assert!(d.is_listening());
}

/// LISTEN through a transaction-mode PgBouncer reaches no one (the server connection
/// that ran it is lent to others): the watcher finds out when it connects (it does not hear its
/// own probe), says so, and polls every second instead of its configured hour. Straight to
/// PostgreSQL, the probe is heard.
#[tokio::test]
async fn listen_through_a_transaction_mode_pooler_is_found_out_and_polled_instead() {
    let t = Topology::start("deaf-listen").await;
    t.add_tenant("1", "shard_1").await;
    let bouncer = PgBouncer::start(&t.directory, 2).await;
    let pooled = Directory::connect(
        bouncer.config(DIRECTORY_DB),
        DirectoryConfig::default()
            .statements(Statements::Unnamed)
            .poll_interval(HOUR),
    )
    .await
    .unwrap();
    eventually("the watcher to connect", DEADLINE, || async {
        pooled.is_connected().then_some(())
    })
    .await;
    assert!(!pooled.is_listening());
    let direct = t
        .client_directory(DirectoryConfig::default().poll_interval(HOUR))
        .await;
    assert!(direct.is_listening());

    let v = t.add_tenant("2", "shard_2").await;
    tokio::time::timeout(Duration::from_secs(3), pooled.wait_for_version(v))
        .await
        .expect("the short poll brings the change");
    reaches(&direct, v).await;
}

/// A burst of lookups after a full flush waits for this client's only directory
/// connection; the directory answers all along. Lookups whose wait ran out are
/// `DirectoryBusy` (retryable, and say so), never served from the cache "as if the directory
/// were down" (5,995 of 6,000 were); a second try answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_waiting_for_a_busy_pool_are_not_taken_for_an_outage() {
    // Long enough for any one lookup's query on a loaded 2-core machine (50 ms was not, once),
    // far shorter than the queue of all of them behind one connection.
    const TENANTS: usize = 4000;
    let t = Topology::start("busy-pool").await;
    t.add_tenants(TENANTS, "shard_1").await;
    let d = t
        .client_directory(
            told_nothing()
                .store_pool_size(1)
                .query_timeout(Duration::from_millis(150)),
        )
        .await;
    for i in 1..=TENANTS {
        d.lookup("tenant", &i.to_string()).await.unwrap();
    }
    // A flush: a change whose history is purged before the client reads it.
    t.add_tenant("new", "shard_1").await;
    t.purge_history().await;
    d.refresh().await.unwrap();
    assert_eq!(d.stats().full_flushes, 1);

    let lookups: Vec<_> = (1..=TENANTS)
        .map(|i| {
            let d = d.clone();
            tokio::spawn(async move { (i, d.lookup("tenant", &i.to_string()).await) })
        })
        .collect();
    let mut busy = Vec::new();
    for l in lookups {
        match l.await.unwrap() {
            (_, Ok(e)) => assert_eq!(e.shard_name, "shard_1"),
            (i, Err(e @ Error::DirectoryBusy { .. })) => {
                assert!(e.is_retryable() && !e.is_directory_outage());
                busy.push(i);
            }
            (i, Err(e)) => panic!("tenant {i}: {e}"),
        }
    }
    assert_eq!(
        d.stats().serving_stale,
        0,
        "nothing was served as in an outage"
    );
    assert!(!busy.is_empty(), "the burst outran one connection");
    for i in busy {
        d.lookup("tenant", &i.to_string()).await.unwrap();
    }
}

/// Mid-move, a read runs on the source and the target; with the target down, the
/// source's answer (it owns every row until the cutover) comes back, saying the target could not
/// be read, instead of failing the read.
#[tokio::test]
async fn a_dual_read_with_its_target_down_returns_the_sources_answer() {
    let t = Topology::start("target-down").await;
    t.add_tenant("1", "shard_1").await;
    t.seed_orders("shard_1", "1", 2, 1).await;
    t.step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    let router = t.connected_router().await;
    let key = EntityKey::new("tenant", "1");
    let count = async |tx: &tokio_postgres::Transaction<'_>| {
        let row = tx
            .query_one("SELECT count(*) FROM orders WHERE tenant_id = '1'", &[])
            .await?;
        Ok::<i64, Error>(row.get(0))
    };
    assert_eq!(
        router.read(&key, count).await.unwrap(),
        Reads::Both {
            source: 2,
            target: 0
        }
    );
    t.shard_cluster("shard_2").stop();
    let reads = router.read(&key, count).await.unwrap();
    assert!(
        matches!(&reads, Reads::SourceOnly { source: 2, target_unavailable } if target_unavailable.contains("shard_2")),
        "{reads:?}"
    );
    assert_eq!(count_orders(&router, "1").await.unwrap(), 2);
    // A policy of FailClosed is about the directory, not a shard: same answer.
    let closed = t.router(
        t.client_directory(DirectoryConfig::default().policy(Policy::FailClosed))
            .await,
    );
    assert!(matches!(
        closed.read(&key, count).await.unwrap(),
        Reads::SourceOnly { source: 2, .. }
    ));
}
