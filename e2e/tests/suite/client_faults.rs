//! The client under faults: a forged notification, a directory whose version went
//! back, a watcher that cannot reconnect while the directory answers queries.

use std::time::Duration;

use std::sync::Arc;

use shard_directory_client::{
    Directory, DirectoryConfig, EntityKey, Error, Policy, Rejection, RetryPolicy, Router,
    ShardConfig, Statements, WATCHER_APPLICATION_NAME,
};
use shard_directory_e2e::pgbouncer::PgBouncer;
use shard_directory_e2e::topology::{DIRECTORY_DB, SHARD_DB};
use shard_directory_e2e::{eventually, reaches, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

/// A lookup that must answer within the deadline (a spinning fill never would).
async fn lookup_in_time(d: &Directory, id: &str) -> String {
    tokio::time::timeout(DEADLINE, d.lookup("tenant", id))
        .await
        .unwrap_or_else(|_| panic!("lookup of tenant {id} did not answer in time"))
        .unwrap()
        .shard_name
        .to_string()
}

/// Any role that can connect may NOTIFY; the payload is a hint to read the version.
#[tokio::test]
async fn a_forged_notification_is_only_a_hint() {
    let t = Topology::start("forged").await;
    let v = t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    reaches(&d, v).await;
    let nobody = t.dba().await;
    nobody
        .batch_execute(
            "CREATE ROLE nobody LOGIN; SET ROLE nobody; \
             SELECT pg_notify('shard_directory', '9223372036854775807')",
        )
        .await
        .unwrap();
    // A real change after it: once the client has it, it has handled the forged one too
    // (notifications arrive in order).
    let real = t.add_tenant("2", "shard_2").await;
    reaches(&d, real).await;
    assert_eq!(d.version(), real, "the forged version was never adopted");
    assert_eq!(lookup_in_time(&d, "2").await, "shard_2");
    assert_eq!(d.stats().version_regressions, 0);
}

/// The directory restored from an older backup (or failed over to a standby that lost
/// commits) stands below the version the client knew: the client adopts it, counts it and
/// flushes, instead of re-reading forever.
#[tokio::test]
async fn a_directory_whose_version_went_back_is_adopted_not_read_forever() {
    let t = Topology::start("regress").await;
    t.add_tenant("1", "shard_1").await;
    let known = t.add_tenant("2", "shard_1").await;
    // Hourly poll, so only the fill can notice.
    let d = t
        .client_directory(DirectoryConfig::default().poll_interval(Duration::from_secs(3600)))
        .await;
    reaches(&d, known).await;
    assert_eq!(lookup_in_time(&d, "1").await, "shard_1");
    // The restore: the older backup knew tenant 2 on shard_2, at version 1.
    t.dba()
        .await
        .batch_execute(
            "SET search_path = shard_directory;
             ALTER TABLE shard_directory DISABLE TRIGGER USER;
             ALTER TABLE shard_directory_version DISABLE TRIGGER USER;
             UPDATE shard_directory SET shard_name = 'shard_2', version = 1 WHERE entity_id = '2';
             UPDATE shard_directory_version SET version = 1;
             ALTER TABLE shard_directory ENABLE TRIGGER USER;
             ALTER TABLE shard_directory_version ENABLE TRIGGER USER;",
        )
        .await
        .unwrap();
    assert_eq!(lookup_in_time(&d, "2").await, "shard_2");
    assert_eq!(d.version(), 1);
    assert_eq!(d.stats().version_regressions, 1);
    // Entries cached before the restore are not served as current: tenant 1 is read again.
    let misses = d.stats().cache_misses;
    assert_eq!(lookup_in_time(&d, "1").await, "shard_1");
    assert_eq!(d.stats().cache_misses, misses + 1);
    // And the restored directory's next change is heard as news.
    let next = t
        .step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    assert_eq!(next, 2);
    reaches(&d, next).await;
}

/// An outage is the store being unreachable, not the watcher reconnecting. Here the
/// watcher cannot reconnect (the database takes no new connection) while the store's pooled
/// connection still answers: lookups are answered, also under `FailClosed`, and see changes.
#[tokio::test]
async fn lookups_go_to_the_store_while_the_watcher_cannot_reconnect() {
    let t = Topology::start("watcherless").await;
    let v = t.add_tenant("1", "shard_1").await;
    let d = t
        .client_directory(DirectoryConfig::default().policy(Policy::FailClosed))
        .await;
    reaches(&d, v).await;
    assert_eq!(lookup_in_time(&d, "1").await, "shard_1");
    let dba = t.dba().await;
    dba.batch_execute(
        "UPDATE pg_database SET datallowconn = false WHERE datname = current_database()",
    )
    .await
    .unwrap();
    let killed: i64 = dba
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            &[&WATCHER_APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1);
    eventually("the watcher to notice", DEADLINE, || async {
        (!d.is_connected()).then_some(())
    })
    .await;
    // A change the watcher cannot hear: the lookup goes to the store and sees it.
    dba.execute(
        "SELECT shard_directory.begin_move('tenant', '1', 'shard_2')",
        &[],
    )
    .await
    .unwrap();
    let entry = tokio::time::timeout(DEADLINE, d.lookup("tenant", "1"))
        .await
        .unwrap()
        .expect("answered from the store, not refused by FailClosed");
    assert_eq!(entry.target_shard.as_deref(), Some("shard_2"));
    assert!(!d.is_connected());
    dba.batch_execute(
        "UPDATE pg_database SET datallowconn = true WHERE datname = current_database()",
    )
    .await
    .unwrap();
    eventually("the watcher to reconnect", DEADLINE, || async {
        d.is_connected().then_some(())
    })
    .await;
}

/// `is_retryable()` says yes where running the work again can help (deadlock, admin
/// shutdown, too many connections, a connection that failed), and no where it cannot.
#[tokio::test]
async fn is_retryable_covers_the_transient_server_errors() {
    let t = Topology::start("retryable").await;
    t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    let r = t.router(d);
    let key = shard_directory_client::EntityKey::new("tenant", "1");
    let fail = async |sql: &'static str| {
        r.run(&key, async |tx| {
            tx.batch_execute(sql).await?;
            Ok::<_, shard_directory_client::Error>(())
        })
        .await
        .unwrap_err()
    };
    for (errcode, retryable) in [
        ("40P01", true),
        ("57P01", true),
        ("53300", true),
        ("08006", true),
        ("23505", false),
        ("42501", false),
    ] {
        let sql: &'static str = Box::leak(
            format!("DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{errcode}'; END $$")
                .into_boxed_str(),
        );
        assert_eq!(fail(sql).await.is_retryable(), retryable, "{errcode}");
    }
    let killed = fail("SELECT pg_terminate_backend(pg_backend_pid())").await;
    assert!(killed.is_retryable(), "{killed:?}");
}

/// Concurrent misses for one key make one directory query; an unknown entity is cached
/// (until the next change) like any entry.
#[tokio::test]
async fn concurrent_misses_make_one_query_and_unknown_entities_are_cached() {
    let t = Topology::start("singleflight").await;
    t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    // Hold the first fill between its query and its store into the cache until all ten
    // lookups have missed.
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let hook_release = release.clone();
    d.set_fill_hook(Some(std::sync::Arc::new(move || {
        let release = hook_release.clone();
        Box::pin(async move { release.notified().await })
    })));
    let (misses, queries) = (d.stats().cache_misses, d.stats().store_queries);
    let lookups = futures_util::future::join_all((0..10).map(|_| d.lookup("tenant", "1")));
    let release_when_all_missed = async {
        eventually("ten lookups to miss", DEADLINE, || async {
            (d.stats().cache_misses == misses + 10).then_some(())
        })
        .await;
        d.set_fill_hook(None);
        release.notify_waiters();
        release.notify_one();
    };
    let (answers, ()) = tokio::time::timeout(
        DEADLINE,
        futures_util::future::join(lookups, release_when_all_missed),
    )
    .await
    .expect("the lookups answer");
    assert!(answers
        .iter()
        .all(|a| a.as_ref().unwrap().shard_name == "shard_1"));
    assert_eq!(
        d.stats().store_queries,
        queries + 1,
        "one query for ten misses"
    );

    // An unknown entity: asked twice, read once, and found once it exists.
    let queries = d.stats().store_queries;
    for _ in 0..2 {
        assert!(matches!(
            d.lookup("tenant", "404").await,
            Err(shard_directory_client::Error::UnknownEntity(_))
        ));
    }
    assert_eq!(d.stats().store_queries, queries + 1);
    let v = t.add_tenant("404", "shard_2").await;
    reaches(&d, v).await;
    assert_eq!(lookup_in_time(&d, "404").await, "shard_2");
}

/// The caller's own error type in the closure.
#[derive(Debug)]
enum AppError {
    OutOfStock,
    Routing(shard_directory_client::Error),
}

impl From<shard_directory_client::Error> for AppError {
    fn from(e: shard_directory_client::Error) -> Self {
        AppError::Routing(e)
    }
}

impl From<tokio_postgres::Error> for AppError {
    fn from(e: tokio_postgres::Error) -> Self {
        AppError::Routing(e.into())
    }
}

/// Items 7 and 8: the closure returns the caller's error type and an `Err` rolls back;
/// isolation level and read-only are set at BEGIN, and `read` is read-only.
#[tokio::test]
async fn the_closure_returns_its_own_error_type_and_transactions_take_options() {
    use shard_directory_client::{IsolationLevel, TxOptions};
    let t = Topology::start("txoptions").await;
    t.add_tenant("1", "shard_1").await;
    let r = t.router(t.client_directory(DirectoryConfig::default()).await);
    let key = shard_directory_client::EntityKey::new("tenant", "1");
    let err = r
        .run(&key, async |tx| {
            tx.execute("INSERT INTO orders VALUES ('1', 'reserved')", &[])
                .await?;
            Err::<(), _>(AppError::OutOfStock)
        })
        .await
        .unwrap_err();
    assert!(matches!(err, AppError::OutOfStock), "{err:?}");
    assert!(
        t.orders("shard_1", "1").await.is_empty(),
        "the business error rolled the insert back"
    );
    // The router's own errors come back in the caller's type too.
    let unknown = shard_directory_client::EntityKey::new("tenant", "nope");
    let err = r
        .run(&unknown, async |_| Ok::<(), AppError>(()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AppError::Routing(shard_directory_client::Error::UnknownEntity(_))
        ),
        "{err:?}"
    );

    let seen = r
        .run_with(
            &key,
            TxOptions::default().isolation(IsolationLevel::Serializable),
            async |tx| {
                let row = tx
                    .query_one("SELECT current_setting('transaction_isolation')", &[])
                    .await?;
                Ok::<String, AppError>(row.get(0))
            },
        )
        .await
        .unwrap();
    assert_eq!(seen, "serializable");
    let read_only = r
        .read(&key, async |tx| {
            let row = tx
                .query_one("SELECT current_setting('transaction_read_only')", &[])
                .await?;
            Ok::<String, AppError>(row.get(0))
        })
        .await
        .unwrap()
        .merge(|a, _| a);
    assert_eq!(read_only, "on");
}

/// A directory that silently stops answering (SIGSTOP: it accepts nothing and answers
/// nothing, as behind a link that drops packets) moves lookups to the outage policy within the
/// configured bounds; the watcher gives up at its poll deadline.
#[tokio::test]
async fn a_directory_that_stops_answering_moves_lookups_to_the_policy_in_bounded_time() {
    let t = Topology::start("silent").await;
    t.add_tenant("1", "shard_1").await;
    let v = t.add_tenant("2", "shard_1").await;
    let second = Duration::from_secs(1);
    let d = t
        .client_directory(
            DirectoryConfig::default()
                .poll_interval(second)
                .query_timeout(second)
                .connect_timeout(second),
        )
        .await;
    reaches(&d, v).await;
    assert_eq!(lookup_in_time(&d, "1").await, "shard_1");

    let frozen = t.directory.freeze();
    eventually(
        "the watcher to give up on the silent directory",
        DEADLINE,
        || async { (!d.is_connected()).then_some(()) },
    )
    .await;
    // The cached active entry: the store does not answer in time, the policy serves the cache.
    let stale = d.stats().serving_stale;
    assert_eq!(lookup_in_time(&d, "1").await, "shard_1");
    assert_eq!(d.stats().serving_stale, stale + 1);
    // Nothing cached: the policy's error says the directory did not answer.
    let err = tokio::time::timeout(DEADLINE, d.lookup("tenant", "2"))
        .await
        .expect("a bounded answer")
        .unwrap_err();
    assert!(
        matches!(err, shard_directory_client::Error::DirectoryTimeout { .. }) && err.is_retryable(),
        "{err:?}"
    );

    drop(frozen);
    eventually("the watcher to reconnect", DEADLINE, || async {
        d.is_connected().then_some(())
    })
    .await;
    assert_eq!(lookup_in_time(&d, "2").await, "shard_1");
}

/// The stamp is prepared once per connection; a routed transaction then costs BEGIN and
/// one round trip for the stamp (no prepare). Seen from inside the session: the stamp's
/// prepared statement is the same one, prepared at the same time, in two transactions.
#[tokio::test]
async fn the_stamp_is_prepared_once_per_connection() {
    let t = Topology::start("stamp").await;
    t.add_tenant("1", "shard_1").await;
    let r = t.router(t.client_directory(DirectoryConfig::default()).await);
    let key = shard_directory_client::EntityKey::new("tenant", "1");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let prepared: Vec<String> = r
            .run(&key, async |tx| {
                let rows = tx
                    .query(
                        "SELECT name || ' ' || prepare_time::text FROM pg_prepared_statements \
                         WHERE statement LIKE '%app.directory_version%' \
                           AND statement NOT LIKE '%pg_prepared_statements%'",
                        &[],
                    )
                    .await?;
                Ok::<_, shard_directory_client::Error>(rows.iter().map(|r| r.get(0)).collect())
            })
            .await
            .unwrap();
        assert_eq!(prepared.len(), 1, "{prepared:?}");
        seen.push(prepared);
    }
    assert_eq!(seen[0], seen[1], "not prepared again");
}

/// A tenant moved to a shard added after the router started is routed there: the
/// router learns the shard from the directory's registry (`shards.conninfo`) and connects with
/// the application's credentials. A router not told to learn says `UnknownShard`.
#[tokio::test]
async fn a_shard_added_at_run_time_is_learned_from_the_registry() {
    let t = Topology::with_shards("learn", 3).await;
    t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    let known: Vec<_> = t
        .shard_configs()
        .into_iter()
        .filter(|(name, _)| name != "shard_3")
        .map(|(name, config)| shard_directory_client::ShardConfig::new(name, config))
        .collect();
    let credentials = t.shard_configs()[0].1.clone();
    let fixed = shard_directory_client::Router::new(d.clone(), known.clone()).unwrap();
    let learning = shard_directory_client::Router::new(d.clone(), known)
        .unwrap()
        .learn_shards(shard_directory_client::ShardConfig::new("app", credentials));
    t.move_tenant("1", "shard_3").await;
    let key = shard_directory_client::EntityKey::new("tenant", "1");
    let write = async |r: &shard_directory_client::Router| {
        r.run(&key, async |tx| {
            tx.execute(
                "INSERT INTO orders (tenant_id, item) VALUES ('1', 'on the new shard')",
                &[],
            )
            .await?;
            Ok::<_, shard_directory_client::Error>(())
        })
        .await
    };
    assert!(matches!(
        write(&fixed).await,
        Err(shard_directory_client::Error::UnknownShard { .. })
    ));
    write(&learning).await.expect("routed to the learned shard");
    assert!(t
        .orders("shard_3", "1")
        .await
        .contains(&"on the new shard".to_owned()));
}

/// Queries through a real PgBouncer in transaction mode (two server connections per
/// pool, so consecutive transactions of one client land on different server connections), LISTEN
/// straight to PostgreSQL. Routing, the stamp and a stale-route retry work through it; a watcher
/// that only polls works through it; a watcher whose LISTEN goes direct hears changes with no
/// poll at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_the_stamp_retries_and_the_poll_work_through_pgbouncer_in_transaction_mode() {
    let t = Topology::start("bouncer").await;
    t.add_tenant("8842", "shard_1").await;
    let directory_bouncer = PgBouncer::start(&t.directory, 2).await;
    let shard_bouncers: Vec<(String, PgBouncer)> = futures_util::future::join_all(
        t.shards
            .iter()
            .map(async |(name, cluster)| (name.clone(), PgBouncer::start(cluster, 2).await)),
    )
    .await;
    let through_bouncer = |config: DirectoryConfig| {
        let config = config.statements(Statements::Unnamed);
        Directory::connect(directory_bouncer.config(DIRECTORY_DB), config)
    };
    let router = |directory| {
        let shards = shard_bouncers.iter().map(|(name, bouncer)| {
            // Pool size odd, against PgBouncer's two server connections taken in turn: a pooled
            // connection used again lands on the other server connection.
            ShardConfig::new(name.clone(), bouncer.config(SHARD_DB))
                .statements(Statements::Unnamed)
                .pool_size(3)
        });
        Arc::new(Router::new(directory, shards).unwrap())
    };
    let hour = Duration::from_secs(3600);
    // Queries through the pooler, LISTEN direct, no poll: only a notification can bring news.
    let listening = through_bouncer(
        DirectoryConfig::default()
            .listen_config(t.directory_config())
            .poll_interval(hour),
    )
    .await
    .unwrap();
    // Everything through the pooler, no LISTEN: the poll brings news.
    let polling = through_bouncer(
        DirectoryConfig::default()
            .listen(false)
            .poll_interval(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    // Through the pooler, told nothing: learns of the move from the shard's refusal. Its shard
    // pools are the application's own (`with_pool`).
    let unaware = shard_bouncers.iter().fold(
        Router::new(
            through_bouncer(DirectoryConfig::default().listen(false).poll_interval(hour))
                .await
                .unwrap(),
            [],
        )
        .unwrap(),
        |router, (name, bouncer)| {
            let manager = deadpool_postgres::Manager::from_config(
                bouncer.config(SHARD_DB),
                tokio_postgres::NoTls,
                deadpool_postgres::ManagerConfig::default(),
            );
            let pool = deadpool_postgres::Pool::builder(manager)
                .max_size(3)
                .build()
                .unwrap();
            router.with_pool(name.clone(), pool, Statements::Unnamed)
        },
    );

    let listening = router(listening);
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let router = listening.clone();
            tokio::spawn(async move {
                let item = format!("before {i}");
                router
                    .run(&EntityKey::new("tenant", "8842"), async move |tx| {
                        tx.execute("INSERT INTO orders VALUES ('8842', $1)", &[&item])
                            .await?;
                        Ok::<_, Error>(())
                    })
                    .await
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    // Then one at a time: the pool's connections are used again, on other server connections.
    for i in 0..12 {
        let item = format!("then {i}");
        listening
            .run(&EntityKey::new("tenant", "8842"), async |tx| {
                tx.execute("INSERT INTO orders VALUES ('8842', $1)", &[&item])
                    .await?;
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
    }
    assert_eq!(t.orders("shard_1", "8842").await.len(), 20);

    unaware.directory().lookup("tenant", "8842").await.unwrap();
    let moved = t.move_tenant("8842", "shard_2").await;
    reaches(listening.directory(), moved).await;
    reaches(&polling, moved).await;
    unaware
        .run(&EntityKey::new("tenant", "8842"), async |tx| {
            tx.execute("INSERT INTO orders VALUES ('8842', 'after')", &[])
                .await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert_eq!(unaware.directory().stats().rejections("moved"), 1);
    let on_target = t.orders("shard_2", "8842").await;
    assert_eq!(on_target.len(), 21, "{on_target:?}");
    assert!(on_target.contains(&"after".to_owned()));
    assert!(t.orders("shard_1", "8842").await.is_empty());
    assert!(
        !directory_bouncer.log().is_empty(),
        "the directory's queries went through PgBouncer"
    );
}

/// With feature `native-tls`, the store, the watcher and the shards' connections use TLS
/// when the connection string asks for it (`sslmode=require`), against clusters with `ssl = on`
/// and a self-signed certificate the client is told to trust; not trusting it, the client
/// refuses to connect.
#[tokio::test]
async fn connections_use_tls_when_the_connection_string_asks_for_it() {
    use shard_directory_client::native_tls::{Certificate, TlsConnector};

    let t = Topology::start("tls").await;
    let mut trusted = TlsConnector::builder();
    for cluster in std::iter::once(&t.directory).chain(t.shards.iter().map(|(_, c)| c)) {
        let pem = cluster.enable_tls().await;
        trusted.add_root_certificate(Certificate::from_pem(&pem).unwrap());
    }
    let trusted = trusted.build().unwrap();
    t.add_tenant("8842", "shard_1").await;
    let require_tls = |mut config: tokio_postgres::Config| {
        config
            .ssl_mode(tokio_postgres::config::SslMode::Require)
            .application_name("tls_client");
        config
    };

    // The system's roots do not include the clusters' own certificates.
    let refused = Directory::connect(
        require_tls(t.directory_config()),
        DirectoryConfig::default(),
    )
    .await
    .expect_err("an untrusted certificate is refused");
    assert!(refused.is_directory_outage(), "{refused}");
    let chain = format!("{refused:?}");
    assert!(chain.contains("certificate"), "{chain}");

    let d = Directory::connect(
        require_tls(t.directory_config()),
        DirectoryConfig::default().tls(trusted.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        d.lookup("tenant", "8842").await.unwrap().shard_name,
        "shard_1"
    );
    let later = t.add_tenant("2", "shard_2").await;
    reaches(&d, later).await;
    // Every connection of the client to the directory (the store's, the watcher's) is TLS.
    let (all_tls, connections): (bool, i64) = {
        let row = t
            .dba()
            .await
            .query_one(
                "SELECT bool_and(s.ssl), count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a \
                 USING (pid) WHERE a.application_name IN ('tls_client', $1)",
                &[&WATCHER_APPLICATION_NAME],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(
        all_tls && connections >= 2,
        "{connections} connections, all TLS: {all_tls}"
    );

    let shards = t
        .shard_configs()
        .into_iter()
        .map(|(name, config)| ShardConfig::new(name, require_tls(config)).tls(trusted.clone()));
    let router = Router::new(d, shards).unwrap();
    let shard_tls = router
        .run(&EntityKey::new("tenant", "8842"), async |tx| {
            tx.execute("INSERT INTO orders VALUES ('8842', 'over tls')", &[])
                .await?;
            let row = tx
                .query_one(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await?;
            Ok::<bool, Error>(row.get(0))
        })
        .await
        .unwrap();
    assert!(shard_tls, "the routed transaction ran over TLS");
    assert_eq!(t.orders("shard_1", "8842").await, ["over tls"]);
}

/// A shard says the route is stale while the directory does not answer (frozen with
/// SIGSTOP; the watchers have not noticed yet, so the cache still looks current): the refresh
/// fails, and the outage policy decides. `FailClosed` gives up at once (retryable);
/// `ServeFromCache` re-runs on the cached route until the deadline, then returns the shard's
/// refusal. Nothing is written.
#[tokio::test]
async fn a_refresh_that_fails_during_a_retry_goes_through_the_outage_policy() {
    let t = Topology::start("refreshfail").await;
    let v = t.add_tenant("8842", "shard_1").await;
    let second = Duration::from_secs(1);
    let config = DirectoryConfig::default()
        .query_timeout(second)
        .connect_timeout(second);
    let closed = t
        .client_directory(config.clone().policy(Policy::FailClosed))
        .await;
    let serving = t.client_directory(config).await;
    for d in [&closed, &serving] {
        assert_eq!(lookup_in_time(d, "8842").await, "shard_1");
    }
    // Above any version the directory has: every route to shard_1 is stale.
    t.shard("shard_1")
        .await
        .execute(
            "SELECT shard_directory.raise_min_accepted($1)",
            &[&(v + 1000)],
        )
        .await
        .unwrap();
    let _frozen = t.directory.freeze();
    let key = EntityKey::new("tenant", "8842");
    let insert = async |router: &Router| {
        let run = router.run(&key, async |tx| {
            tx.execute("INSERT INTO orders VALUES ('8842', 'x')", &[])
                .await?;
            Ok::<_, Error>(())
        });
        tokio::time::timeout(DEADLINE, run)
            .await
            .expect("the retry loop ends in bounded time")
            .unwrap_err()
    };
    let retry = RetryPolicy::default().deadline(Duration::from_millis(1500));

    let err = insert(&t.router(closed.clone()).with_retry(retry.clone())).await;
    assert!(matches!(err, Error::FailClosed { .. }), "{err}");
    assert!(err.is_retryable());
    assert_eq!(closed.stats().rejections("stale"), 1);

    let err = insert(&t.router(serving.clone()).with_retry(retry)).await;
    assert!(
        matches!(
            err,
            Error::Rejected {
                rejection: Rejection::Stale { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(serving.stats().serving_stale >= 1);
    assert!(t.orders("shard_1", "8842").await.is_empty());
}
