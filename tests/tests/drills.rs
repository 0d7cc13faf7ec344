//! Outage drills (issue 11, item 4): one shard stopped while traffic flows, and the watcher's
//! connection killed during a move. (The directory stopped during traffic is
//! `client.rs`'s `directory_down_serves_active_entries_from_cache_and_fails_closed_mid_move`;
//! the mover killed mid-move is `cli.rs` and the proof.)

use std::time::{Duration, Instant};

use shard_directory_client::{
    DirectoryConfig, EntityKey, Error, RetryPolicy, Router, WATCHER_APPLICATION_NAME,
};
use shard_directory_e2e::{eventually, reaches, Topology};

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
