//! The relay (`shard-directory relay`): instances learn the directory's changes through Redis
//! pub/sub from one directory session instead of one LISTEN connection each, LISTEN again while
//! the relay is silent and let go when it is back, and take no message that is not sealed with
//! the key, of their epoch and recent.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use shard_directory_client::{Directory, DirectoryConfig, RelayConfig, WATCHER_APPLICATION_NAME};
use shard_directory_e2e::mover_cli;
use shard_directory_e2e::proxy::Proxy;
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::topology::connected_directory;
use shard_directory_e2e::{eventually, reaches, Topology};
use shard_directory_protocol::relay::{seal, Change};
use shard_directory_relay::RELAY_APPLICATION_NAME;

const DEADLINE: Duration = Duration::from_secs(15);
const KEY: &[u8] = b"the relay's key";
const CHANNEL: &str = "shard_directory";

/// `shard-directory relay` on `t`'s directory, publishing to `redis` (killed on drop).
fn relay(t: &Topology, redis: &RedisServer) -> tokio::process::Child {
    relay_to(t, &redis.url(), "postgres")
}

/// `shard-directory relay` on `t`'s directory as `role`, publishing to the Redis at `url`.
fn relay_to(t: &Topology, url: &str, role: &str) -> tokio::process::Child {
    mover_cli::relay(t, url, KEY, role)
}

async fn relayed(t: &Topology, redis: &RedisServer) -> Directory {
    relayed_from(&redis.url(), t.directory_config()).await
}

async fn relayed_from(url: &str, at: tokio_postgres::Config) -> Directory {
    let relay = RelayConfig::new(url, KEY.to_vec()).silence(Duration::from_secs(1));
    connected_directory(at, DirectoryConfig::default().relay(relay)).await
}

/// The directory's sessions named `application_name`.
async fn sessions(t: &Topology, application_name: &str) -> i64 {
    t.dba()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&application_name],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until the directory has `watchers` watcher sessions.
async fn watchers(t: &Topology, watchers: i64) {
    eventually("the watcher sessions", DEADLINE, || async {
        (sessions(t, WATCHER_APPLICATION_NAME).await == watchers).then_some(())
    })
    .await;
}

#[tokio::test]
async fn instances_follow_the_relay_without_connections_of_their_own_and_listen_while_it_is_away() {
    let t = Topology::start("relay").await;
    t.add_tenants(3, "shard_1").await;
    let redis = RedisServer::start().await;
    let mut process = relay(&t, &redis);
    let instances = [relayed(&t, &redis).await, relayed(&t, &redis).await];
    // Every instance lets its LISTEN connection go: one directory session serves them all.
    watchers(&t, 0).await;
    assert_eq!(sessions(&t, RELAY_APPLICATION_NAME).await, 1);
    for d in &instances {
        for tenant in ["1", "3"] {
            assert_eq!(
                d.lookup("tenant", tenant).await.unwrap().shard_name,
                "shard_1"
            );
        }
    }
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    for d in &instances {
        reaches(d, moved).await;
        let e = d.lookup("tenant", "1").await.unwrap();
        assert_eq!(e.target_shard.as_deref(), Some("shard_2"));
        assert!(d.stats().relay_messages > 0);
        assert!(d.is_connected());
        // By entity, as with its own LISTEN: the tenant that did not change is still cached.
        let before = d.stats();
        assert_eq!(d.lookup("tenant", "3").await.unwrap().shard_name, "shard_1");
        let after = d.stats();
        assert_eq!(
            (after.cache_hits - before.cache_hits, after.full_flushes),
            (1, 0)
        );
    }

    // The relay stops: each instance LISTENs again and hears the next change itself.
    process.kill().await.unwrap();
    watchers(&t, 2).await;
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '2', 'shard_2')")
        .await;
    for d in &instances {
        reaches(d, moved).await;
        let e = d.lookup("tenant", "2").await.unwrap();
        assert_eq!(e.target_shard.as_deref(), Some("shard_2"));
    }

    // Back: they let go again, and what changed meanwhile is not lost.
    let v = t.add_tenant("new", "shard_2").await;
    let _process = relay(&t, &redis);
    watchers(&t, 0).await;
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '3', 'shard_2')")
        .await;
    for d in &instances {
        reaches(d, moved.max(v)).await;
        let e = d.lookup("tenant", "3").await.unwrap();
        assert_eq!(e.target_shard.as_deref(), Some("shard_2"));
        assert_eq!(
            d.lookup("tenant", "new").await.unwrap().shard_name,
            "shard_2"
        );
    }
}

/// A subscription whose connection to Redis is stranded (it holds, nothing passes, neither end
/// hears of it: a lost NAT entry or load balancer flow) is made again after twice the silence:
/// the instance LISTENs while it hears nothing, then lets go once more and follows the relay.
/// Without the subscription's own deadline it waits on the stranded connection for ever, and
/// the fleet's LISTEN sessions come back for good.
#[tokio::test]
async fn a_stranded_subscription_is_made_again_and_the_instance_lets_go_of_its_listen() {
    let t = Topology::start("relay-stranded").await;
    t.add_tenants(2, "shard_1").await;
    let redis = RedisServer::start().await;
    let _process = relay(&t, &redis);
    let proxy = Proxy::forwarding(redis.port()).await;
    let through = format!("redis://127.0.0.1:{}/", proxy.port());
    let d = relayed_from(&through, t.directory_config()).await;
    watchers(&t, 0).await;

    proxy.strand();
    // Silent: the instance LISTENs itself, then subscribes again (a new connection passes).
    watchers(&t, 1).await;
    watchers(&t, 0).await;
    let taken = d.stats().relay_messages;
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    reaches(&d, moved).await;
    let e = d.lookup("tenant", "1").await.unwrap();
    assert_eq!(e.target_shard.as_deref(), Some("shard_2"));
    assert!(d.stats().relay_messages > taken, "{:?}", d.stats());
}

/// A message is taken only when sealed with the key, of the client's epoch and recent: a forged
/// one claiming a later version with nothing changed would stamp every cached entry with it.
#[tokio::test]
async fn forged_old_and_foreign_messages_change_nothing_and_a_replay_is_not_taken() {
    let t = Topology::start("relay-forged").await;
    t.add_tenants(2, "shard_1").await;
    let redis = RedisServer::start().await;
    let d = relayed(&t, &redis).await;
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    let epoch: String = t
        .dba()
        .await
        .query_one("SELECT shard_directory.directory_epoch()", &[])
        .await
        .unwrap()
        .get(0);
    let known = d.version();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let claim = |epoch: &str, sealed_at_ms: u64| Change {
        epoch: epoch.into(),
        since: known,
        version: known + 10,
        changed: Some(vec![]),
        sealed_at_ms,
    };
    let mut publisher = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let messages = [
        seal(&claim(&epoch, now), b"not the key"),
        format!("{}.{{}}", "00".repeat(32)),
        seal(&claim(&epoch, now - 60_000), KEY),
        seal(&claim("1.1", now), KEY),
    ];
    for message in messages {
        let _: i64 = publisher.publish(CHANNEL, message).await.unwrap();
    }
    eventually("the four messages to be refused", DEADLINE, || async {
        (d.stats().relay_refused == 4).then_some(())
    })
    .await;
    assert_eq!(d.version(), known, "no message was taken");
    assert_eq!(d.stats().relay_messages, 0);

    // A real change, then a replay of a genuine message from before it: not taken, and the
    // question it raises (did the directory go back?) is put to the directory, which says no.
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    reaches(&d, moved).await;
    let replay = Change {
        epoch: epoch.clone(),
        since: known,
        version: known,
        changed: Some(vec![]),
        sealed_at_ms: now,
    };
    let _: i64 = publisher
        .publish(CHANNEL, seal(&replay, KEY))
        .await
        .unwrap();
    eventually("the replay to be refused", DEADLINE, || async {
        (d.stats().relay_refused == 5).then_some(())
    })
    .await;
    assert_eq!(d.stats().version_regressions, 0);
    assert_eq!(d.version(), moved);
    let e = d.lookup("tenant", "1").await.unwrap();
    assert_eq!(e.target_shard.as_deref(), Some("shard_2"));
}

/// The Redis ACLs docs/operations.md gives: the relay may only publish, the instances only
/// subscribe; both work, and an instance's user cannot publish.
/// Redis ACLs and directory grants as documented: the relay and the instances hold the router's
/// grants, the relay may only publish and the instances only subscribe.
#[tokio::test]
async fn with_the_documented_acls_the_relay_publishes_and_instances_only_subscribe() {
    let t = Topology::start("relay-acl").await;
    t.add_tenants(1, "shard_1").await;
    let router = t.router_role().await;
    let redis = RedisServer::start_with(&[
        "--user",
        "default",
        "off",
        "--user",
        "relay",
        "on",
        ">relay-secret",
        "resetchannels",
        "&shard_directory",
        "-@all",
        "+publish",
        "+ping",
        "--user",
        "app",
        "on",
        ">app-secret",
        "resetchannels",
        "&shard_directory",
        "-@all",
        "+subscribe",
        "+ping",
    ])
    .await;
    let _process = relay_to(&t, &redis.url_as("relay", "relay-secret"), "app_router");
    let d = relayed_from(&redis.url_as("app", "app-secret"), router).await;
    watchers(&t, 0).await;
    assert_eq!(sessions(&t, RELAY_APPLICATION_NAME).await, 1);
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    reaches(&d, moved).await;
    assert!(d.stats().relay_messages > 0);
    let mut app = redis::Client::open(redis.url_as("app", "app-secret"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let refused = app
        .publish::<_, _, i64>(CHANNEL, "forged")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("NOPERM"), "{refused}");
}
