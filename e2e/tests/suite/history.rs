//! One history (issue 42): the directory's epoch and version must say which history a client's
//! cached entries belong to, which `<system identifier>.<timeline>` did not. A directory restored from a
//! cold copy keeps its epoch and numbers the lost versions again; two standbys promoted side by
//! side both take timeline 2; a standby left ahead of a restored primary still answers at its
//! own versions. In each, a client must end up routing by what the surviving directory says,
//! within a poll or a notification: its lookups name the directory's shard, and a write routed
//! through its `Router` lands there.

use std::time::Duration;

use shard_directory_client::{Directory, DirectoryConfig, RelayConfig, Router, SharedCacheConfig};
use shard_directory_e2e::mover_cli;
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::topology::{connected_directory, DIRECTORY_DB};
use shard_directory_e2e::{eventually, reaches, within, Cluster, ColdCopy, Topology};

const DEADLINE: Duration = Duration::from_secs(15);
const KEY: &[u8] = b"the relay's key";

/// A client that polls every second, so that it may notice within [`DEADLINE`] what no
/// notification tells it.
fn polling() -> DirectoryConfig {
    DirectoryConfig::default().poll_interval(Duration::from_secs(1))
}

/// [`polling`], with the shared cache in `redis`.
fn sharing(redis: &RedisServer) -> DirectoryConfig {
    polling().shared_cache(SharedCacheConfig::new(redis.url()))
}

/// Re-points tenant `id` to `shard` as a DBA does in an emergency, one statement a line (as
/// `postgres --single` takes them too).
fn repoint(id: &str, shard: &str) -> String {
    format!(
        "BEGIN\nSET LOCAL shard_directory.allow_repoint = on\n\
         UPDATE shard_directory.shard_directory SET shard_name = '{shard}' \
         WHERE entity_type = 'tenant' AND entity_id = '{id}'\nCOMMIT\n"
    )
}

/// Runs `sql` on the directory database of `cluster`; returns its version after it.
async fn change(cluster: &Cluster, sql: &str) -> i64 {
    let c = cluster.connect(DIRECTORY_DB).await;
    c.batch_execute(&sql.replace('\n', ";\n"))
        .await
        .expect("a directory change");
    version_of(cluster).await
}

async fn version_of(cluster: &Cluster) -> i64 {
    cluster
        .connect(DIRECTORY_DB)
        .await
        .query_one("SELECT shard_directory.current_version()", &[])
        .await
        .expect("the directory's version")
        .get(0)
}

async fn epoch_of(cluster: &Cluster) -> String {
    cluster
        .connect(DIRECTORY_DB)
        .await
        .query_one("SELECT shard_directory.directory_epoch()", &[])
        .await
        .expect("the directory's epoch")
        .get(0)
}

/// Waits (up to [`DEADLINE`]) until `d`'s lookup of tenant `id` names `shard`; panics with what
/// it kept saying.
pub(crate) async fn says(d: &Directory, id: &str, shard: &str, what: &str) {
    let last = std::sync::Mutex::new(String::new());
    let found = within(DEADLINE, || async {
        let said = match d.lookup("tenant", id).await {
            Ok(e) => format!("{} (read at version {})", e.shard_name, e.directory_version),
            Err(e) => format!("an error: {e}"),
        };
        let right = said.starts_with(&format!("{shard} "));
        *last.lock().unwrap() = said;
        right.then_some(())
    })
    .await;
    assert!(
        found.is_some(),
        "{what}: tenant {id} is on {shard} in the directory, but {DEADLINE:?} later the client \
         still says {} (it knows version {}, stats {:?})",
        last.lock().unwrap(),
        d.version(),
        d.stats()
    );
}

/// A write for tenant `id` routed by `router` lands on the shard the directory names (a
/// retryable refusal is retried, within [`DEADLINE`]), and nowhere else.
pub(crate) async fn writes_land(t: &Topology, router: &Router, id: &str, item: &str) {
    let shard = t.placement(id).await;
    eventually("the routed write to be acknowledged", DEADLINE, || async {
        match Topology::order(router, id, item).await {
            Ok(()) => Some(()),
            Err(e) if e.is_retryable() => None,
            Err(e) => panic!("the write for tenant {id}: {e}"),
        }
    })
    .await;
    for (name, _) in &t.shards {
        let landed = t.orders(name, id).await.contains(&item.to_owned());
        assert_eq!(
            landed,
            *name == shard,
            "the write {item:?} for tenant {id} (on {shard} in the directory) landed on {name}: \
             {landed}"
        );
    }
}

/// The application as it stood before a restore: tenants 1 and 2 on shard_1, a client `d`
/// that learned a change the restore loses (tenant 1 re-pointed to shard_2 at version `lost`,
/// read, and written by through `router`), and the copy of the directory before it: a cold copy
/// (the server stopped, so its first change after the copy mints a lineage the copy lacks) or,
/// `hot`, a base backup of the running server, whose lineage the lost change shares: then only
/// the version going back, and the layers' own checks, tell the histories apart.
struct BeforeRestore {
    t: Topology,
    d: Directory,
    router: Router,
    copy: ColdCopy,
    lost: i64,
}

async fn before_restore(
    name: &str,
    hot: bool,
    d: impl AsyncFnOnce(&Topology) -> Directory,
) -> BeforeRestore {
    let t = Topology::start(name).await;
    let copied = t.add_tenants(2, "shard_1").await;
    let d = d(&t).await;
    let router = t.router(d.clone());
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    let copy = if hot {
        t.directory.base_backup()
    } else {
        t.directory.cold_copy()
    };
    assert_eq!(version_of(&t.directory).await, copied);
    let lost = change(&t.directory, &repoint("1", "shard_2")).await;
    assert_eq!(lost, copied + 1);
    reaches(&d, lost).await;
    let one = d.lookup("tenant", "1").await.unwrap();
    assert_eq!(
        (one.shard_name.as_str(), one.directory_version),
        ("shard_2", lost)
    );
    writes_land(&t, &router, "1", "before the restore").await;
    BeforeRestore {
        t,
        d,
        router,
        copy,
        lost,
    }
}

/// Puts the cold copy back and, before any client can connect, makes a different change that
/// takes the lost version's number again: tenant 2 re-pointed to shard_2 (tenant 1 is on
/// shard_1 again).
async fn restore_reusing_the_lost_version(b: &BeforeRestore) {
    let dir = &b.t.directory;
    dir.put_back_cold_copy(&b.copy);
    dir.single_user_sql(DIRECTORY_DB, &repoint("2", "shard_2"));
    dir.restart();
    assert_eq!(
        version_of(dir).await,
        b.lost,
        "the restored directory numbers the lost version again"
    );
    assert_eq!(b.t.placement("1").await, "shard_1");
    assert_eq!(b.t.placement("2").await, "shard_2");
}

/// Case 1: an instance that learned a version the restore lost, and meets the restored
/// directory at the same (epoch, version) with other contents, keeps routing tenant 1 by the
/// lost entry (on shard_2; the directory says shard_1).
#[tokio::test]
async fn a_cold_restore_that_reuses_a_version_is_another_history_for_an_instance_that_knew_it() {
    let redis = RedisServer::start().await;
    let b = before_restore("history-restore", false, async |t| {
        t.client_directory(sharing(&redis)).await
    })
    .await;
    restore_reusing_the_lost_version(&b).await;
    says(&b.d, "1", "shard_1", "after the restore").await;
    says(&b.d, "2", "shard_2", "after the restore").await;
    writes_land(&b.t, &b.router, "1", "after the restore").await;
}

/// Case 1, second half: a fresh instance sharing the Redis in which the first put its read of
/// the lost version takes that entry (tenant 1 on shard_2) as current at the reused version.
#[tokio::test]
async fn a_fresh_instance_does_not_take_a_lost_versions_entry_from_the_shared_cache() {
    let redis = RedisServer::start().await;
    let b = before_restore("history-restore-fresh", false, async |t| {
        t.client_directory(sharing(&redis)).await
    })
    .await;
    restore_reusing_the_lost_version(&b).await;
    let fresh = b.t.client_directory(sharing(&redis)).await;
    assert_eq!(fresh.version(), b.lost);
    says(&fresh, "1", "shard_1", "a fresh instance").await;
    writes_land(&b.t, &b.t.router(fresh), "1", "from a fresh instance").await;
}

/// `shard-directory relay` on `t`'s directory, publishing to `redis` (killed on drop).
fn relay(t: &Topology, redis: &RedisServer) -> tokio::process::Child {
    mover_cli::relay(t, &redis.url(), KEY, "postgres")
}

/// An instance following the relay, which it lets be silent for `silence` (`None`: the
/// default) before it LISTENs itself, polling every second.
async fn relayed(t: &Topology, redis: &RedisServer, silence: Option<Duration>) -> Directory {
    let mut relay = RelayConfig::new(redis.url(), KEY.to_vec());
    if let Some(silence) = silence {
        relay = relay.silence(silence);
    }
    let d = connected_directory(t.directory_config(), polling().relay(relay)).await;
    eventually(
        "the instance to take the relay's messages",
        DEADLINE,
        || async { (d.stats().relay_messages > 0).then_some(()) },
    )
    .await;
    d
}

/// Case 3: an instance following the relay, through a cold restore that reuses the lost
/// version: the relay's messages after the restore say nothing went back, and it keeps
/// routing tenant 1 by the lost entry.
#[tokio::test]
async fn an_instance_following_the_relay_sees_a_restore_that_reuses_a_version() {
    let redis = RedisServer::start().await;
    let mut process = None;
    let b = before_restore("history-relay", false, async |t| {
        process = Some(relay(t, &redis));
        relayed(t, &redis, Some(RELAYED_THROUGHOUT)).await
    })
    .await;
    restore_reusing_the_lost_version(&b).await;
    let heard = b.d.stats().relay_messages;
    eventually("the relay to speak after the restore", DEADLINE, || async {
        (b.d.stats().relay_messages > heard + 2).then_some(())
    })
    .await;
    says(&b.d, "1", "shard_1", "following the relay").await;
    writes_land(&b.t, &b.router, "1", "after the restore").await;
    drop(process);
}

/// Longer than the test: the instance does not LISTEN itself while the directory is restored
/// (with the default, 3 s, whether it does depends on how long the restore takes).
const RELAYED_THROUGHOUT: Duration = Duration::from_secs(120);

/// Case 3, without a reused version: the directory is only back at the copy's version (a base
/// backup, in the lineage of the lost change: one epoch). Its own watcher would read the version
/// go back and flush; the relay, which starts again from the version it finds, says nothing
/// went back, and its messages are below what the instance knows.
#[tokio::test]
async fn an_instance_following_the_relay_sees_a_directory_restored_to_an_older_version() {
    let redis = RedisServer::start().await;
    let mut process = None;
    let b = before_restore("history-relay-back", true, async |t| {
        process = Some(relay(t, &redis));
        relayed(t, &redis, Some(RELAYED_THROUGHOUT)).await
    })
    .await;
    b.t.directory.restore_cold_copy(&b.copy);
    assert_eq!(version_of(&b.t.directory).await, b.lost - 1);
    says(&b.d, "1", "shard_1", "following the relay").await;
    writes_land(&b.t, &b.router, "1", "after the restore").await;
    drop(process);
}

/// Case 4: the instance reads the directory (restored from a base backup: one epoch) go back
/// below the version it knew and flushes (a version regression), and its next lookup takes the
/// lost entry back from Redis.
#[tokio::test]
async fn the_shared_cache_does_not_undo_the_flush_of_a_version_regression() {
    let redis = RedisServer::start().await;
    let b = before_restore("history-regressed", true, async |t| {
        t.client_directory(sharing(&redis)).await
    })
    .await;
    b.t.directory.restore_cold_copy(&b.copy);
    let back = version_of(&b.t.directory).await;
    assert_eq!(back, b.lost - 1);
    eventually(
        "the instance to read the version go back",
        DEADLINE,
        || async { (b.d.version() == back).then_some(()) },
    )
    .await;
    says(&b.d, "1", "shard_1", "after the regression's flush").await;
    writes_land(&b.t, &b.router, "1", "after the restore").await;
}

/// Case 4, a fresh instance: it starts at the restored version, below the read of the lost
/// one that Redis holds, and takes that read as newer than what it knows.
#[tokio::test]
async fn a_fresh_instance_does_not_take_an_entry_read_above_the_directorys_version() {
    let redis = RedisServer::start().await;
    let b = before_restore("history-regressed-fresh", true, async |t| {
        t.client_directory(sharing(&redis)).await
    })
    .await;
    b.t.directory.restore_cold_copy(&b.copy);
    let fresh = b.t.client_directory(sharing(&redis)).await;
    assert_eq!(fresh.version(), b.lost - 1);
    says(&fresh, "1", "shard_1", "a fresh instance").await;
    writes_land(&b.t, &b.t.router(fresh), "1", "from a fresh instance").await;
}

/// The directory's version on `cluster`, if it answers now (a server restarting, or a
/// standby coming up, does not).
pub(crate) async fn answered_version(cluster: &Cluster) -> Option<i64> {
    let (c, connection) = cluster
        .config(DIRECTORY_DB)
        .connect(tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(connection);
    let row = c
        .query_one("SELECT shard_directory.current_version()", &[])
        .await
        .ok()?;
    Some(row.get(0))
}

/// Waits until `standby` has replayed directory version `version`.
pub(crate) async fn replayed(standby: &Cluster, version: i64) {
    eventually("the standby to replay", DEADLINE * 2, || async {
        answered_version(standby)
            .await
            .filter(|v| *v >= version)
            .map(|_| ())
    })
    .await;
}

/// Case 2: two standbys of a crashed directory, both promoted: both on timeline 2, one epoch.
/// The application's primary is A; B, listed as a replica, is not in recovery and re-pointed
/// tenant 1 to shard_2 after its promotion, at the version A reached with another change. The
/// client takes B's reads: same epoch, version high enough.
#[tokio::test]
async fn a_promoted_server_is_never_read_as_a_replica() {
    let mut t = Topology::start("history-split").await;
    let before = t.add_tenants(2, "shard_1").await;
    let mut a = t.streaming_standby("history-split-a").await;
    let b = t.directory.standby("history-split-b");
    replayed(&a, before).await;
    replayed(&b, before).await;
    t.directory.crash();
    a.promote();
    b.promote();
    // A is the directory from now on.
    std::mem::swap(&mut t.directory, &mut a);
    assert_eq!(
        epoch_of(&t.directory).await,
        epoch_of(&b).await,
        "both promoted to timeline 2"
    );
    let on_b = change(&b, &repoint("1", "shard_2")).await;
    let on_a = t.add_tenant("3", "shard_1").await;
    assert_eq!(on_a, on_b, "both histories at one version");

    let config = polling()
        .replica(b.config(DIRECTORY_DB))
        .replica_wait(Duration::from_secs(2));
    let d = connected_directory(t.directory_config(), config).await;
    let router = t.router(d.clone());
    says(&d, "1", "shard_1", "reading B as a replica").await;
    assert_eq!(
        d.stats().replica_reads,
        0,
        "B is not in recovery: not a replica"
    );
    writes_land(&t, &router, "1", "after the promotions").await;
}

/// Case 5: the directory's primary is restored from a base backup at version N (one epoch
/// with the lost versions: no change since), while its
/// streaming standby, which had replayed N+2, can no longer stream from it and keeps answering
/// reads at N+2. The client reads the primary go back (and flushes), then takes the replica's
/// read of the lost versions again.
#[tokio::test]
async fn a_replica_ahead_of_a_restored_primary_does_not_drag_the_client_back() {
    let t = Topology::start("history-replica").await;
    let copied = t.add_tenants(2, "shard_1").await;
    let replica = t.streaming_standby("history-replica-standby").await;
    let config = polling()
        .replica(replica.config(DIRECTORY_DB))
        .replica_wait(Duration::from_secs(2));
    let d = connected_directory(t.directory_config(), config).await;
    let router = t.router(d.clone());
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");

    let copy = t.directory.base_backup();
    change(&t.directory, &repoint("1", "shard_2")).await;
    let lost = change(&t.directory, &repoint("2", "shard_2")).await;
    assert_eq!(lost, copied + 2);
    // Far ahead in WAL, so that the restored primary does not reach its position meanwhile.
    t.directory
        .connect("postgres")
        .await
        .batch_execute(
            "CREATE TABLE junk AS SELECT repeat('x', 1000) FROM generate_series(1, 4000)",
        )
        .await
        .unwrap();
    replayed(&replica, lost).await;
    reaches(&d, lost).await;
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_2");

    t.directory.restore_cold_copy(&copy);
    assert_eq!(version_of(&t.directory).await, copied);
    assert_eq!(
        version_of(&replica).await,
        lost,
        "the standby still answers, ahead"
    );
    eventually(
        "the client to read the primary go back",
        DEADLINE,
        || async { (d.version() == copied).then_some(()) },
    )
    .await;
    says(&d, "1", "shard_1", "with a replica ahead of the primary").await;
    says(&d, "2", "shard_1", "with a replica ahead of the primary").await;
    writes_land(&t, &router, "1", "after the restore").await;
}

/// Case 2, before the stray server changes anything: its state is still one the directory had,
/// in the directory's epoch, but it is no longer a standby and may change at any moment; it is
/// never read as a replica (`pg_is_in_recovery()`), and the reads go to the primary.
#[tokio::test]
async fn a_promoted_server_is_not_read_as_a_replica_even_before_it_changes() {
    let t = Topology::start("history-stray").await;
    let before = t.add_tenants(2, "shard_1").await;
    let b = t.streaming_standby("history-stray-b").await;
    replayed(&b, before).await;
    b.promote();
    assert_eq!(epoch_of(&t.directory).await, epoch_of(&b).await);
    let config = polling()
        .replica(b.config(DIRECTORY_DB))
        .replica_wait(Duration::from_secs(2));
    let d = connected_directory(t.directory_config(), config).await;
    let stats = d.stats();
    says(&d, "1", "shard_1", "with a promoted server as a replica").await;
    let after = d.stats();
    assert_eq!(after.replica_reads, stats.replica_reads, "not read there");
    assert!(
        after.replica_fallbacks > stats.replica_fallbacks,
        "sent, then made on the primary"
    );
}
