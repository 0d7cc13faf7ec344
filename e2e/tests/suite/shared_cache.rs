//! The client's shared (Redis) cache, against a real redis-server: instances share fills at the
//! same directory version, never an older one, and a Redis outage falls through to the directory.

use std::time::Duration;

use shard_directory_client::{Directory, DirectoryConfig, SharedCacheConfig};
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::{eventually, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

async fn directory(t: &Topology, redis: &RedisServer) -> Directory {
    let config = DirectoryConfig::default().shared_cache(SharedCacheConfig::new(redis.url()));
    t.client_directory(config).await
}

#[tokio::test]
async fn instances_share_fills_at_the_same_version_and_never_an_older_one() {
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

    // The entry changes: the copy stored at the old version must not be served at the new one.
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
