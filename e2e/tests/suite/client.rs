//! The client crate against real clusters (a directory and two shards): invalidation reaching many
//! instances, a missed notification recovered, stale routes refused and repaired, the fill /
//! invalidation race, and the outage policy.

use std::sync::Arc;
use std::time::Duration;

use shard_directory_client::{
    DirectoryConfig, EntityKey, Error, Policy, Reads, RetryPolicy, Router, State,
    WATCHER_APPLICATION_NAME,
};
use shard_directory_e2e::{eventually, reaches, Topology};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

const DEADLINE: Duration = Duration::from_secs(15);

fn tenant(id: &str) -> EntityKey {
    EntityKey::new("tenant", id)
}

async fn insert(router: &Router, id: &str, item: &str) -> Result<(), Error> {
    let (id, item) = (id.to_owned(), item.to_owned());
    router
        .run(&tenant(&id), async move |tx| {
            tx.execute("INSERT INTO orders VALUES ($1, $2)", &[&id, &item])
                .await?;
            Ok(())
        })
        .await
}

/// `curl -s $addr$path`, for the debug endpoint.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// `run` and `read` can be spawned on a multi-thread runtime and awaited in an axum handler (both
/// need `Send` futures); the writes land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_read_are_send_spawned_on_a_multi_thread_runtime_and_in_an_axum_handler() {
    let t = Topology::start("send").await;
    t.add_tenant("8842", "shard_1").await;
    let router = Arc::new(t.router(t.client_directory(DirectoryConfig::default()).await));
    let shown = format!("{router:?}");
    assert!(
        shown.contains(r#"shards: ["shard_1", "shard_2"]"#),
        "{shown}"
    );
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move { insert(&router, "8842", &format!("spawned {i}")).await })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }

    async fn count(axum::extract::State(router): axum::extract::State<Arc<Router>>) -> String {
        let rows = router
            .read(&tenant("8842"), async |tx| {
                let row = tx
                    .query_one("SELECT count(*) FROM orders WHERE tenant_id = '8842'", &[])
                    .await?;
                Ok::<i64, Error>(row.get(0))
            })
            .await
            .unwrap();
        rows.merge(|source, _| source).to_string()
    }
    let app = axum::Router::new()
        .route("/count", axum::routing::get(count))
        .with_state(router);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    assert_eq!(http_get(addr, "/count").await, "4");
    server.abort();
}

#[tokio::test]
async fn a_change_made_with_sql_reaches_eight_client_instances() {
    let t = Topology::start("fanout").await;
    t.add_tenant("8842", "shard_1").await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        let d = t.client_directory(DirectoryConfig::default()).await;
        assert_eq!(
            d.lookup("tenant", "8842").await.unwrap().shard_name,
            "shard_1"
        );
        let any_port = "127.0.0.1:0".parse().unwrap();
        let (addr, task) = shard_directory_client::debug_http::serve(d.clone(), any_port)
            .await
            .unwrap();
        clients.push((d, addr, task));
    }
    let v = t
        .step("SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')")
        .await;
    // As the guide's verification checks it: every instance's /debug/directory reports the new version.
    for (d, addr, _task) in &clients {
        eventually(
            "the instance to report the new version",
            DEADLINE,
            || async {
                let body = http_get(*addr, "/debug/directory").await;
                let body: serde_json::Value = serde_json::from_str(&body).unwrap();
                (body["version"].as_i64() == Some(v) && body["connected"] == true).then_some(())
            },
        )
        .await;
        let e = d.lookup("tenant", "8842").await.unwrap();
        assert_eq!(
            (e.state, e.target_shard.as_deref(), e.directory_version),
            (State::Migrating, Some("shard_2"), v)
        );
    }
}

#[tokio::test]
async fn a_notification_missed_while_disconnected_is_recovered() {
    let t = Topology::start("missed").await;
    t.add_tenant("8842", "shard_1").await;
    // Poll only every hour: only the reconnect can bring the change in.
    let d = t
        .client_directory(DirectoryConfig::default().poll_interval(Duration::from_secs(3600)))
        .await;
    d.lookup("tenant", "8842").await.unwrap();
    let dba = t.dba().await;
    // Kill the listener and change the directory in one statement: the notification goes nowhere.
    let v: i64 = dba
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            &[&WATCHER_APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(v, 1, "one watcher connection");
    let v = t
        .step("SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')")
        .await;
    reaches(&d, v).await;
    assert_eq!(
        d.lookup("tenant", "8842").await.unwrap().state,
        State::Migrating
    );
}

#[tokio::test]
async fn a_stale_route_is_refused_then_repaired_and_lands_on_the_right_shard() {
    let t = Topology::start("stale").await;
    t.add_tenant("8842", "shard_1").await;
    // A client that hears of changes only from shards: no LISTEN, a poll that never comes.
    let config = DirectoryConfig::default()
        .listen(false)
        .poll_interval(Duration::from_secs(3600));
    let r = t.router(t.client_directory(config).await);
    insert(&r, "8842", "a").await.unwrap();

    let moved_at = t.move_tenant("8842", "shard_2").await;
    assert!(
        r.directory().version() < moved_at,
        "the client still has the old view"
    );
    let before = r.directory().stats();
    insert(&r, "8842", "b").await.unwrap();
    let after = r.directory().stats();
    assert_eq!(after.rejections("moved") - before.rejections("moved"), 1);
    assert_eq!(
        after.store_queries, before.store_queries,
        "moved_to routed the retry without a directory query"
    );
    assert!(
        t.orders("shard_1", "8842").await.is_empty(),
        "the mover took \"a\" along"
    );
    assert_eq!(t.orders("shard_2", "8842").await, ["a", "b"]);

    // No moved_to: a shard-wide minimum above the client's version. The client refreshes.
    let dba = t.dba().await;
    dba.execute(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', '7', 'shard_1')",
        &[],
    )
    .await
    .unwrap();
    let now = t.step("SELECT shard_directory.current_version()").await;
    t.shard("shard_2")
        .await
        .execute("SELECT shard_directory.raise_min_accepted($1)", &[&now])
        .await
        .unwrap();
    insert(&r, "8842", "c").await.unwrap();
    let last = r.directory().stats();
    assert_eq!(last.rejections("stale") - after.rejections("stale"), 1);
    assert!(last.store_queries > after.store_queries);
    assert_eq!(t.orders("shard_2", "8842").await, ["a", "b", "c"]);
}

/// T moves s1 -> s2 at v8, then s2 -> s3 at v11; s2 raises min_accepted to 11 and unfences T,
/// as docs/shard.md recommends. A client that knows v11 but still routes T to s1 is told
/// `moved(s2, 8)`: the repair must carry version 8, not 11, or s2 takes a write for a tenant that
/// lives on s3.
#[tokio::test]
async fn a_moved_repair_carries_the_fences_version_so_a_later_move_is_not_missed() {
    let t = Topology::with_shards("moved-twice", 3).await;
    t.add_tenant("8842", "shard_1").await;
    let deaf = DirectoryConfig::default()
        .listen(false)
        .poll_interval(Duration::from_secs(3600));
    let r = t.router(t.client_directory(deaf).await);
    insert(&r, "8842", "a").await.unwrap();
    let first = t.move_tenant("8842", "shard_2").await;
    let second = t.move_tenant("8842", "shard_3").await;
    let s2 = t.shard("shard_2").await;
    s2.execute("SELECT shard_directory.raise_min_accepted($1)", &[&second])
        .await
        .unwrap();
    s2.execute("SELECT shard_directory.unfence('tenant', '8842')", &[])
        .await
        .unwrap();
    assert!(first < second);

    // The client still routes T to shard_1 (its cache predates both moves); while that attempt
    // runs, another task of the client learns the newest version.
    let directory = r.directory().clone();
    let item = "b".to_owned();
    r.run(&tenant("8842"), async |tx| {
        directory.refresh().await.expect("refresh");
        tx.execute("INSERT INTO orders VALUES ('8842', $1)", &[&item])
            .await?;
        Ok::<_, Error>(())
    })
    .await
    .expect("the write lands after repairs");
    assert!(
        t.orders("shard_2", "8842").await.is_empty(),
        "no write on shard_2"
    );
    assert_eq!(t.orders("shard_3", "8842").await, ["a", "b"]);
}

#[tokio::test]
async fn other_errors_are_returned_untouched_and_not_retried() {
    let t = Topology::start("errors").await;
    t.add_tenant("8842", "shard_1").await;
    let r = t.router(t.client_directory(DirectoryConfig::default()).await);
    let err = r
        .run(&tenant("8842"), async |tx| {
            Ok::<_, Error>(
                tx.execute("INSERT INTO no_such_table VALUES (1)", &[])
                    .await?,
            )
        })
        .await
        .unwrap_err();
    match &err {
        Error::Db(e) => assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
        ),
        other => panic!("expected the database error untouched, got {other:?}"),
    }
    assert!(!err.is_retryable());
    assert_eq!(r.directory().stats().retries, 0);
    assert!(matches!(
        r.directory().lookup("tenant", "nope").await,
        Err(Error::UnknownEntity(_))
    ));
}

#[tokio::test]
async fn migrating_reads_both_shards_and_read_only_refuses_writes_before_any_round_trip() {
    let t = Topology::start("states").await;
    t.add_tenant("8842", "shard_1").await;
    // What a mover's copy would have put on the target already.
    t.shard("shard_2")
        .await
        .batch_execute(
            "BEGIN; SELECT set_config('app.directory_version', '1', true);
             INSERT INTO orders VALUES ('8842', 'copied'); COMMIT",
        )
        .await
        .unwrap();
    let d = t.client_directory(DirectoryConfig::default()).await;
    let r = t.router(d.clone());
    insert(&r, "8842", "original").await.unwrap();
    let v = t
        .step("SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')")
        .await;
    reaches(&d, v).await;
    let count = async |tx: &tokio_postgres::Transaction<'_>| -> Result<i64, Error> {
        Ok(tx
            .query_one("SELECT count(*) FROM orders WHERE tenant_id = '8842'", &[])
            .await?
            .get(0))
    };
    let reads = r.read(&tenant("8842"), count).await.unwrap();
    assert!(matches!(reads, Reads::Both { .. }), "{reads:?}");
    assert_eq!(reads.merge(|a, b| a + b), 2);
    insert(&r, "8842", "during the copy").await.unwrap();
    assert_eq!(
        t.orders("shard_1", "8842").await,
        ["during the copy", "original"]
    );

    let v = t
        .step("SELECT shard_directory.freeze('tenant', '8842')")
        .await;
    reaches(&d, v).await;
    let before = d.stats();
    // A router whose deadline is shorter than the freeze gives up with ReadOnly...
    let impatient = t
        .router(d.clone())
        .with_retry(RetryPolicy::default().deadline(Duration::from_millis(200)));
    let err = insert(&impatient, "8842", "frozen").await.unwrap_err();
    assert!(
        matches!(err, Error::ReadOnly(_)) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(
        d.stats().rejections,
        before.rejections,
        "refused before any round trip"
    );
    assert_eq!(r.read(&tenant("8842"), count).await.unwrap(), Reads::One(2));

    // ...the default one waits the freeze out and writes where the tenant landed.
    let retries = d.stats().retries;
    let cutover = async {
        eventually("the write to wait on the freeze", DEADLINE, || async {
            (d.stats().retries > retries).then_some(())
        })
        .await;
        t.step("SELECT shard_directory.complete_move('tenant', '8842')")
            .await
    };
    let (written, _) = tokio::time::timeout(
        DEADLINE,
        futures_util::future::join(insert(&r, "8842", "waited out the freeze"), cutover),
    )
    .await
    .expect("the write finishes once the freeze is over");
    written.unwrap();
    assert_eq!(
        t.orders("shard_2", "8842").await,
        ["copied", "waited out the freeze"]
    );
}

#[tokio::test]
async fn a_fill_that_raced_an_invalidation_is_not_served() {
    let t = Topology::start("race").await;
    t.add_tenant("8842", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    let (paused, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (p, r) = (paused.clone(), resume.clone());
    d.set_fill_hook(Some(Arc::new(move || {
        let (p, r) = (p.clone(), r.clone());
        Box::pin(async move {
            p.notify_one();
            r.notified().await;
        })
    })));
    // The fill reads shard_1, then waits at the hook.
    let lookup = tokio::spawn({
        let d = d.clone();
        async move { d.lookup("tenant", "8842").await }
    });
    tokio::time::timeout(DEADLINE, paused.notified())
        .await
        .expect("the fill reaches the hook");
    let v = t
        .step("SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')")
        .await;
    reaches(&d, v).await;
    d.set_fill_hook(None);
    resume.notify_one();
    let e = tokio::time::timeout(DEADLINE, lookup)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (e.state, e.directory_version),
        (State::Migrating, v),
        "the fill read before the change was not served"
    );
    assert_eq!(
        d.lookup("tenant", "8842").await.unwrap().state,
        State::Migrating
    );
}

#[tokio::test]
async fn directory_down_serves_active_entries_from_cache_and_fails_closed_mid_move() {
    let t = Topology::start("outage").await;
    t.add_tenant("1", "shard_1").await;
    t.add_tenant("2", "shard_1").await;
    let v = t
        .step("SELECT shard_directory.begin_move('tenant', '2', 'shard_2')")
        .await;
    let serving = t.client_directory(DirectoryConfig::default()).await;
    let closed = t
        .client_directory(DirectoryConfig::default().policy(Policy::FailClosed))
        .await;
    for d in [&serving, &closed] {
        reaches(d, v).await;
        d.lookup("tenant", "1").await.unwrap();
        d.lookup("tenant", "2").await.unwrap();
    }
    let r = t.router(serving.clone());
    // Tenant 3 is cached active; then its move begins and the client hears of it, but reads it
    // no more before the outage: the cache knows its entry changed, not to what.
    t.add_tenant("3", "shard_1").await;
    serving.lookup("tenant", "3").await.unwrap();
    let v3 = t
        .step("SELECT shard_directory.begin_move('tenant', '3', 'shard_2')")
        .await;
    reaches(&serving, v3).await;

    t.directory.stop();
    for d in [&serving, &closed] {
        eventually("the watcher to notice", DEADLINE, || async {
            (!d.is_connected()).then_some(())
        })
        .await;
    }
    // ServeFromCache: the active tenant keeps working, and the stale serve is counted.
    let stale_before = serving.stats().serving_stale;
    insert(&r, "1", "during the outage").await.unwrap();
    assert_eq!(serving.stats().serving_stale, stale_before + 1);
    // ... the migrating one fails closed, and so does one never cached.
    assert!(matches!(
        serving.lookup("tenant", "2").await,
        Err(Error::FailClosed {
            state: Some(State::Migrating),
            ..
        })
    ));
    // ... and so does the one whose entry is known to have changed since it was cached.
    assert!(
        matches!(
            serving.lookup("tenant", "3").await,
            Err(Error::FailClosed {
                state: Some(State::Active),
                reason: "its entry changed after it was cached",
                ..
            })
        ),
        "an entry known to have changed is not served"
    );
    let uncached = serving.lookup("tenant", "4").await.unwrap_err();
    assert!(uncached.is_retryable(), "{uncached:?}");
    // FailClosed fails everything.
    assert!(matches!(
        closed.lookup("tenant", "1").await,
        Err(Error::FailClosed { .. })
    ));

    t.directory.restart();
    for d in [&serving, &closed] {
        eventually("the watcher to reconnect", DEADLINE, || async {
            d.is_connected().then_some(())
        })
        .await;
    }
    let v = t
        .step("SELECT shard_directory.abort_move('tenant', '2')")
        .await;
    for d in [&serving, &closed] {
        reaches(d, v).await;
        assert_eq!(d.lookup("tenant", "2").await.unwrap().state, State::Active);
        assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    }
    assert_eq!(t.orders("shard_1", "1").await, ["during the outage"]);
}
