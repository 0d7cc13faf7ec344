//! Routing that stays right: a read is checked as a write is, a refusal
//! naming a shard the router cannot reach sends it to the directory, fills overtaken by the
//! watcher are not taken for a restore, and an entry cached before a full flush is not served as
//! unchanged during an outage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shard_directory_client::{
    Directory, DirectoryConfig, EntityKey, Error, Reads, Rejection, Router, ShardConfig,
    SharedCacheConfig, State,
};
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::topology::{connected_directory, told_nothing, DIRECTORY_DB};
use shard_directory_e2e::workload::count_orders;
use shard_directory_e2e::{eventually, reaches, Cluster, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

/// Runs `sql` on the directory database of `cluster`; returns the directory's version after it.
async fn change(cluster: &Cluster, sql: &str) -> i64 {
    let c = cluster.connect(DIRECTORY_DB).await;
    c.batch_execute(sql).await.expect("a directory change");
    c.query_one("SELECT shard_directory.current_version()", &[])
        .await
        .unwrap()
        .get(0)
}

/// The directory fails over to a standby that missed its last change (tenant 1
/// re-pointed to shard_2, which a client learned, cached, shared through Redis and wrote by),
/// and the new primary numbers versions again from before it: one change later it stands at
/// the version the client knew, with other contents. The epoch (system identifier and
/// timeline) tells the histories apart: the client flushes when it reads the new one, a fresh
/// instance does not take the lost entry from the shared cache, and the next write lands where
/// the directory now says (it landed on shard_2: `changes_since` reported nothing, and no fence
/// there refused it).
#[tokio::test]
async fn a_directory_promoted_without_its_last_change_is_another_history() {
    let t = Topology::start("promoted").await;
    let before = t.add_tenant("1", "shard_1").await;
    let standby = t.directory.standby("promoted-standby");
    eventually("the standby to replay", DEADLINE, || async {
        let c = standby.connect(DIRECTORY_DB).await;
        let v: i64 = c
            .query_one("SELECT shard_directory.current_version()", &[])
            .await
            .unwrap()
            .get(0);
        (v == before).then_some(())
    })
    .await;
    let both: tokio_postgres::Config = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname={DIRECTORY_DB} \
         target_session_attrs=read-write",
        t.directory.port(),
        standby.port()
    )
    .parse()
    .unwrap();
    let redis = RedisServer::start().await;
    let second = Duration::from_secs(1);
    let config = DirectoryConfig::default()
        .connect_timeout(second)
        .query_timeout(second)
        .max_reconnect_backoff(Duration::from_millis(200))
        .shared_cache(SharedCacheConfig::new(redis.url()));
    let d = connected_directory(both.clone(), config.clone()).await;
    let router = t.router(d.clone());

    // The standby stops hearing from the primary; then the primary re-points tenant 1.
    standby.stop();
    let lost = change(
        &t.directory,
        "BEGIN; SET LOCAL shard_directory.allow_repoint = on; \
         UPDATE shard_directory.shard_directory SET shard_name = 'shard_2' \
         WHERE entity_type = 'tenant' AND entity_id = '1'; COMMIT",
    )
    .await;
    reaches(&d, lost).await;
    Topology::order(&router, "1", "before").await.unwrap();
    assert_eq!(t.orders("shard_2", "1").await, ["before"]);

    t.directory.stop();
    standby.restart();
    standby.promote();
    let add = |id: &str| {
        format!(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', '{id}', 'shard_1')"
        )
    };
    let again = change(&standby, &add("2")).await;
    assert_eq!(
        again, lost,
        "the new history numbers the lost version again"
    );
    // A fresh instance at that version, sharing the Redis the lost entry was put in.
    let fresh = Directory::connect(both, config).await.unwrap();
    assert_eq!(fresh.version(), lost);
    assert_eq!(
        fresh.lookup("tenant", "1").await.unwrap().shard_name,
        "shard_1"
    );

    let after = change(&standby, &add("3")).await;
    reaches(&d, after).await;
    assert_eq!(d.stats().epoch_changes, 1);
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    Topology::order(&router, "1", "after").await.unwrap();
    assert_eq!(t.orders("shard_1", "1").await, ["after"]);
    assert_eq!(t.orders("shard_2", "1").await, ["before"]);
}

/// A client that was not told of a cutover (no LISTEN, as behind a pooler) reads the
/// old shard: the check refuses (`moved`), and the read is repaired and runs on the new shard
/// (it returned 0 rows, no refusal). `read_unchecked` is the opt-out, and reads the old shard as
/// it says. A frozen entity is read where it is, and its writes wait.
#[tokio::test]
async fn a_read_routed_by_a_cache_behind_a_cutover_is_refused_and_repaired() {
    let t = Topology::start("checked-read").await;
    for id in ["1", "2"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 3, 1).await;
    }
    let checked = t.router(t.client_directory(told_nothing()).await);
    let unchecked = t.router(t.client_directory(told_nothing()).await);
    for router in [&checked, &unchecked] {
        assert_eq!(count_orders(router, "1").await.unwrap(), 3);
    }
    t.move_tenant("1", "shard_2").await;

    assert_eq!(count_orders(&checked, "1").await.unwrap(), 3);
    assert_eq!(checked.directory().stats().rejections("moved"), 1);
    let stale = unchecked
        .read_unchecked(&EntityKey::new("tenant", "1"), async |tx| {
            let row = tx
                .query_one("SELECT count(*) FROM orders WHERE tenant_id = '1'", &[])
                .await?;
            Ok::<i64, Error>(row.get(0))
        })
        .await
        .unwrap();
    assert_eq!(stale, Reads::One(0), "the old shard, as asked");
    assert_eq!(unchecked.directory().stats().rejections("moved"), 0);

    // Tenant 2 frozen as a cutover freezes it: read_only in the directory, fenced on its source.
    t.step("SELECT shard_directory.begin_move('tenant', '2', 'shard_2')")
        .await;
    t.step("SELECT shard_directory.freeze('tenant', '2')").await;
    t.shard("shard_1")
        .await
        .execute("SELECT shard_directory.fence_frozen('tenant', '2')", &[])
        .await
        .unwrap();
    checked.directory().refresh().await.unwrap();
    assert_eq!(
        checked
            .directory()
            .lookup("tenant", "2")
            .await
            .unwrap()
            .state,
        State::ReadOnly
    );
    assert_eq!(count_orders(&checked, "2").await.unwrap(), 3);
    assert_eq!(checked.directory().stats().rejections("frozen"), 0);
}

/// A transaction routed for tenant a writes a row of tenant b, which has moved: the refusal's
/// `moved_to` is b's, not a's. The router returns the refusal and learns nothing from it for a
/// (it used to route a to b's shard, where a has no fence, and a's next write landed there).
#[tokio::test]
async fn a_moved_refusal_about_another_entity_is_not_learned_for_the_routed_one() {
    let t = Topology::start("moved-other").await;
    for id in ["a", "b"] {
        t.add_tenant(id, "shard_1").await;
    }
    let d = t.client_directory(told_nothing()).await;
    let router = t.router(d.clone());
    d.lookup("tenant", "a").await.unwrap();
    t.move_tenant("b", "shard_2").await;

    let crossed = router
        .run(&EntityKey::new("tenant", "a"), async |tx| {
            tx.execute(
                "INSERT INTO orders (tenant_id, item) VALUES ('b', 'crossed')",
                &[],
            )
            .await?;
            Ok::<(), Error>(())
        })
        .await;
    // The closure's own error comes back: the refusal of b's row, tried once.
    let refused = crossed.expect_err("b's row is not a's to route");
    let Error::Db(db) = &refused else {
        panic!("the closure's database error, not {refused}");
    };
    let rejection = Rejection::of(db).expect("a 40001 with its DETAIL");
    assert!(
        matches!(&rejection, Rejection::Moved { moved_to, .. } if moved_to == "shard_2")
            && rejection.about_another(&EntityKey::new("tenant", "a")),
        "{rejection}"
    );
    assert_eq!(router.directory().stats().rejections("moved"), 1);
    Topology::order(&router, "a", "after").await.unwrap();
    assert_eq!(t.orders("shard_1", "a").await, ["after"]);
    assert!(t.orders("shard_2", "a").await.is_empty());
    assert!(t.orders("shard_2", "b").await.is_empty());
}

/// A refusal's `moved_to` names a shard this router has no settings for (the entity
/// went on from there; or that shard is retired): the router asks the directory, which names a
/// shard it knows (it failed with `UnknownShard`).
#[tokio::test]
async fn a_refusal_naming_a_shard_the_router_cannot_reach_asks_the_directory() {
    let t = Topology::with_shards("stale-moved-to", 3).await;
    t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(told_nothing()).await;
    let known = t
        .shard_configs()
        .into_iter()
        .filter(|(name, _)| name != "shard_3")
        .map(|(name, config)| ShardConfig::new(name, config));
    let router = Router::new(d.clone(), known).unwrap();
    d.lookup("tenant", "1").await.unwrap();
    t.move_tenant("1", "shard_3").await;
    t.move_tenant("1", "shard_2").await;

    Topology::order(&router, "1", "after two moves")
        .await
        .unwrap();
    assert_eq!(t.orders("shard_2", "1").await, ["after two moves"]);
    assert_eq!(d.stats().rejections("moved"), 1);
}

/// A fill whose read the watcher overtakes, twice in a row (a change is made and heard
/// between each read and its store), reads again; nothing went back, so no regression is
/// counted and nothing is flushed (the second was taken for a restore: a WARN, a full flush).
#[tokio::test]
async fn fills_overtaken_by_the_watcher_are_not_taken_for_a_restore() {
    let t = Topology::start("overtaken").await;
    t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    let dba = Arc::new(t.dba().await);
    let rounds = Arc::new(AtomicUsize::new(0));
    let (watched, counted) = (d.clone(), rounds.clone());
    d.set_fill_hook(Some(Arc::new(move || {
        let (dba, d, rounds) = (dba.clone(), watched.clone(), counted.clone());
        Box::pin(async move {
            let round = rounds.fetch_add(1, Ordering::SeqCst);
            if round < 2 {
                dba.execute(
                    "INSERT INTO shard_directory.shard_directory \
                     (entity_type, entity_id, shard_name) VALUES ('tenant', $1, 'shard_2')",
                    &[&format!("new-{round}")],
                )
                .await
                .unwrap();
                let v: i64 = dba
                    .query_one("SELECT shard_directory.current_version()", &[])
                    .await
                    .unwrap()
                    .get(0);
                tokio::time::timeout(DEADLINE, d.wait_for_version(v))
                    .await
                    .expect("the watcher hears the change");
            }
        })
    })));
    let entry = tokio::time::timeout(DEADLINE, d.lookup("tenant", "1"))
        .await
        .expect("the fill ends")
        .unwrap();
    d.set_fill_hook(None);
    assert_eq!(entry.shard_name, "shard_1");
    assert_eq!(
        rounds.load(Ordering::SeqCst),
        3,
        "two reads overtaken, one stored"
    );
    assert_eq!(d.stats().version_regressions, 0);
    assert_eq!(d.stats().full_flushes, 0);
}

/// After a full flush (the directory could not say what changed: its history was
/// purged), the directory goes down. An entry cached before the flush may be one that changed
/// (tenant 1 moved inside the flushed gap): it is not served as unchanged (it was, with its old
/// shard); the policy fails closed for it, as for an entry known to have changed.
#[tokio::test]
async fn an_entry_cached_before_a_full_flush_is_not_served_in_an_outage() {
    let t = Topology::start("flushed-outage").await;
    t.add_tenant("1", "shard_1").await;
    t.add_tenant("2", "shard_1").await;
    let d = t.client_directory(told_nothing()).await;
    for id in ["1", "2"] {
        d.lookup("tenant", id).await.unwrap();
    }
    t.move_tenant("1", "shard_2").await;
    t.purge_history().await;
    let v = t.add_tenant("3", "shard_1").await;
    assert_eq!(d.refresh().await.unwrap(), v);
    assert_eq!(d.stats().full_flushes, 1);

    t.directory.stop();
    for id in ["1", "2"] {
        let err = d.lookup("tenant", id).await.unwrap_err();
        assert!(
            matches!(err, Error::FailClosed { .. }) && err.is_retryable(),
            "tenant {id}: {err}"
        );
    }
    assert_eq!(d.stats().serving_stale, 0);
}
