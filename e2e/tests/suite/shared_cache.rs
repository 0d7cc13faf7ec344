//! The client's shared (Redis) cache, against a real redis-server: instances share fills, an
//! entry stays shared across changes to other entries and is never served once its own changed,
//! and a Redis outage falls through to the directory.

use std::time::Duration;

use shard_directory_client::{Directory, DirectoryConfig, SharedCacheConfig};
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::{eventually, reaches, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

async fn directory(t: &Topology, redis: &RedisServer) -> Directory {
    keeping(t, redis, 100_000).await
}

/// An instance whose change log keeps `kept` changes.
async fn keeping(t: &Topology, redis: &RedisServer, kept: usize) -> Directory {
    let shared = SharedCacheConfig::new(redis.url()).kept_changes(kept);
    t.client_directory(DirectoryConfig::default().shared_cache(shared))
        .await
}

/// Looks `tenant` up on `d`; returns its shard and what the lookup cost: (shared-cache hits,
/// directory queries).
async fn cost(d: &Directory, tenant: &str) -> (String, (u64, u64)) {
    let before = d.stats();
    let shard = d.lookup("tenant", tenant).await.unwrap().shard_name;
    let after = d.stats();
    let cost = (
        after.shared_cache_hits - before.shared_cache_hits,
        after.store_queries - before.store_queries,
    );
    (shard.to_string(), cost)
}

#[tokio::test]
async fn instances_share_fills_and_never_one_read_before_its_entry_changed() {
    let t = Topology::start("shared").await;
    t.add_tenant("8842", "shard_1").await;
    let redis = RedisServer::start().await;
    let (a, b) = (directory(&t, &redis).await, directory(&t, &redis).await);

    assert_eq!(
        a.lookup("tenant", "8842").await.unwrap().shard_name,
        "shard_1"
    );
    let before = b.stats();
    assert_eq!(
        b.lookup("tenant", "8842").await.unwrap().shard_name,
        "shard_1"
    );
    let after = b.stats();
    assert_eq!(after.shared_cache_hits - before.shared_cache_hits, 1);
    assert_eq!(
        after.store_queries, before.store_queries,
        "served by the shared cache"
    );

    // The entry changes: the copy stored before the change must not be served after it.
    let v = t
        .step("SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')")
        .await;
    eventually("b to hear the change", DEADLINE, || async {
        (b.version() == v).then_some(())
    })
    .await;
    let e = b.lookup("tenant", "8842").await.unwrap();
    assert_eq!(
        (e.target_shard.as_deref(), e.directory_version),
        (Some("shard_2"), v)
    );
    assert!(
        b.stats().store_queries > after.store_queries,
        "a miss at the new version goes to the directory"
    );
}

/// Onboarding churn: other tenants are added and one is moved; an instance started after that
/// still takes the entries that did not change from the shared cache, after one read of what
/// changed since they were read, and never the moved tenant's.
#[tokio::test]
async fn entries_that_did_not_change_stay_shared_across_changes_to_others() {
    let t = Topology::start("shared-kept").await;
    t.add_tenants(4, "shard_1").await;
    let redis = RedisServer::start().await;
    let a = directory(&t, &redis).await;
    for tenant in ["1", "2", "3", "4"] {
        assert_eq!(cost(&a, tenant).await.0, "shard_1");
    }
    t.add_tenant("new-1", "shard_2").await;
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '3', 'shard_2')")
        .await;
    t.add_tenant("new-2", "shard_2").await;

    // Started after the changes: its log reaches back to its start only.
    let b = directory(&t, &redis).await;
    assert!(b.version() > moved);
    assert_eq!(
        cost(&b, "1").await,
        ("shard_1".into(), (1, 1)),
        "a shared hit, after one read of what changed since it was stored"
    );
    assert_eq!(cost(&b, "2").await, ("shard_1".into(), (1, 0)));
    let three = b.lookup("tenant", "3").await.unwrap();
    assert_eq!(three.target_shard.as_deref(), Some("shard_2"));
    assert!(three.directory_version >= moved, "read from the directory");

    // More churn, heard by the watcher: the shared entry of tenant 4 is still taken as is.
    let v = t.add_tenant("new-3", "shard_2").await;
    reaches(&b, v).await;
    assert_eq!(cost(&b, "4").await, ("shard_1".into(), (1, 0)));
    let stats = b.stats();
    assert_eq!(
        (stats.shared_cache_hits, stats.shared_cache_misses),
        (3, 1),
        "tenant 3's stored entry was refused"
    );
}

/// A log that cannot reach back (the directory has more changes since the entry's read than the
/// log keeps): the lookup goes to the directory, and the next older entry does not ask for the
/// changes again.
#[tokio::test]
async fn an_entry_older_than_the_log_can_reach_is_read_from_the_directory() {
    let t = Topology::start("shared-beyond").await;
    t.add_tenants(3, "shard_1").await;
    let redis = RedisServer::start().await;
    let a = directory(&t, &redis).await;
    for tenant in ["1", "2", "3"] {
        a.lookup("tenant", tenant).await.unwrap();
    }
    for n in 0..3 {
        t.add_tenant(&format!("new-{n}"), "shard_2").await;
    }
    let b = keeping(&t, &redis, 2).await;
    // One read of the changes (three keys: more than two) and the fill itself.
    assert_eq!(cost(&b, "1").await, ("shard_1".into(), (0, 2)));
    // No second read of the changes for an entry as old.
    assert_eq!(cost(&b, "2").await, ("shard_1".into(), (0, 1)));
    // What b read itself is shared at b's version, in b's reach.
    let c = keeping(&t, &redis, 2).await;
    assert_eq!(cost(&c, "1").await, ("shard_1".into(), (1, 0)));
}

#[tokio::test]
async fn a_redis_outage_falls_through_to_the_directory() {
    let t = Topology::start("shared-down").await;
    t.add_tenant("1", "shard_1").await;
    t.add_tenant("2", "shard_2").await;
    let mut redis = RedisServer::start().await;
    let d = directory(&t, &redis).await;
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    redis.stop();
    let before = d.stats();
    assert_eq!(d.lookup("tenant", "2").await.unwrap().shard_name, "shard_2");
    let after = d.stats();
    assert_eq!(after.shared_cache_misses - before.shared_cache_misses, 1);
    assert_eq!(after.store_queries - before.store_queries, 1);
}

/// The Redis ACL client/README.md gives the instances (keys under the prefix, GET, and the
/// script that keeps the newest read with the SET it runs) is all they need to share fills.
#[tokio::test]
async fn instances_share_fills_with_the_documented_redis_acl() {
    let t = Topology::start("shared-acl").await;
    t.add_tenant("8842", "shard_1").await;
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../client/README.md"))
            .unwrap();
    let acl = readme
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER app on >SECRET "))
        .expect("client/README.md gives the instances' ACL");
    let mut settings = vec![
        "--user",
        "default",
        "off",
        "--user",
        "app",
        "on",
        ">app-secret",
    ];
    settings.extend(acl.split_whitespace());
    let redis = RedisServer::start_with(&settings).await;
    let shared = || SharedCacheConfig::new(redis.url_as("app", "app-secret")).kept_changes(100_000);
    let a = t
        .client_directory(DirectoryConfig::default().shared_cache(shared()))
        .await;
    let b = t
        .client_directory(DirectoryConfig::default().shared_cache(shared()))
        .await;
    assert_eq!(cost(&a, "8842").await, ("shard_1".into(), (0, 1)));
    assert_eq!(cost(&b, "8842").await, ("shard_1".into(), (1, 0)));
}
