//! The directory's read replicas: fills and the reads of what a notification announced go to a
//! streaming standby once it has replayed the version the client needs; a standby that stops
//! replaying, or stops, sends them to the primary, and no lookup is ever answered from behind
//! the version the client knows.

use std::time::Duration;

use shard_directory_client::{Directory, DirectoryConfig, Stats};
use shard_directory_e2e::topology::{connected_directory, DIRECTORY_DB};
use shard_directory_e2e::{eventually, reaches, Cluster, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

/// (served by the replica, sent there and then made on the primary) since `before`.
fn replica_reads(d: &Directory, before: &Stats) -> (u64, u64) {
    let now = d.stats();
    (
        now.replica_reads - before.replica_reads,
        now.replica_fallbacks - before.replica_fallbacks,
    )
}

/// A client reading on `standby`, as `role` on both servers.
async fn with_replica(t: &Topology, standby: &Cluster, role: &str) -> Directory {
    let (mut primary, mut replica) = (t.directory_config(), standby.config(DIRECTORY_DB));
    primary.user(role);
    replica.user(role);
    // Long enough for a loaded machine's replay; a stopped replay costs a test this per read.
    let config = DirectoryConfig::default()
        .replica(replica)
        .replica_wait(Duration::from_secs(2));
    connected_directory(primary, config).await
}

#[tokio::test]
async fn reads_go_to_a_replica_that_has_replayed_the_version_and_to_the_primary_when_behind() {
    let t = Topology::start("replica").await;
    t.add_tenants(100, "shard_1").await;
    // The router's documented grants are all a replica's reader needs.
    t.router_role().await;
    let standby = t.streaming_standby("replica-standby").await;
    let d = with_replica(&t, &standby, "app_router").await;

    let before = d.stats();
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    assert_eq!(
        replica_reads(&d, &before),
        (1, 0),
        "the fill was read on the replica"
    );

    // A change: the notification's read of what changed, and the next fill, on the replica.
    let before = d.stats();
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '1', 'shard_2')")
        .await;
    reaches(&d, moved).await;
    let one = d.lookup("tenant", "1").await.unwrap();
    assert_eq!(
        (one.target_shard.as_deref(), one.directory_version),
        (Some("shard_2"), moved)
    );
    assert_eq!(replica_reads(&d, &before), (2, 0));

    // The replica stops replaying: the change is learned from the primary after the wait, and
    // fills go there too, never answered from the replica's older version.
    let replica = standby.connect(DIRECTORY_DB).await;
    replica
        .batch_execute("SELECT pg_wal_replay_pause()")
        .await
        .unwrap();
    let before = d.stats();
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '2', 'shard_2')")
        .await;
    reaches(&d, moved).await;
    let two = d.lookup("tenant", "2").await.unwrap();
    assert_eq!(
        (two.target_shard.as_deref(), two.directory_version),
        (Some("shard_2"), moved)
    );
    let three = d.lookup("tenant", "3").await.unwrap();
    assert!(
        three.directory_version >= moved,
        "read behind the version known"
    );
    assert_eq!(
        replica_reads(&d, &before),
        (0, 3),
        "the notified read and two fills"
    );

    // Replaying again: the replica serves again.
    replica
        .batch_execute("SELECT pg_wal_replay_resume()")
        .await
        .unwrap();
    let next = std::sync::atomic::AtomicUsize::new(4);
    eventually("the replica to serve fills again", DEADLINE, || async {
        // A tenant not cached yet, each time.
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let before = d.stats();
        d.lookup("tenant", &n.to_string()).await.unwrap();
        (replica_reads(&d, &before) == (1, 0)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_replica_that_stops_sends_reads_to_the_primary_and_rests() {
    let t = Topology::start("replica-down").await;
    t.add_tenants(3, "shard_1").await;
    let standby = t.streaming_standby("replica-down-standby").await;
    let d = with_replica(&t, &standby, "postgres").await;
    standby.stop();
    let before = d.stats();
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    assert_eq!(replica_reads(&d, &before), (0, 1));
    // Left alone for a while: the next fill does not try it.
    assert_eq!(d.lookup("tenant", "2").await.unwrap().shard_name, "shard_1");
    assert_eq!(replica_reads(&d, &before), (0, 1));
}
