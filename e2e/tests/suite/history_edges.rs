//! One history at its edges (issue 42, found by attacking the change): copies of the directory
//! made beside it (`CREATE DATABASE ... TEMPLATE`, a snapshot renamed into its place), a crash
//! of one backend that the postmaster survives, notifications after a restore (the restored
//! primary's, and a forged one), and the lock the epoch's read takes. Each failed before its fix.

use std::time::Duration;

use crate::history::{answered_version, replayed, says, writes_land};

use shard_directory_client::{Directory, DirectoryConfig, Router, SharedCacheConfig};
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::topology::{connected_directory, DIRECTORY_DB};
use shard_directory_e2e::{eventually, reaches, Cluster, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

/// Re-points tenant `id` to `shard` as a DBA does in an emergency.
pub(crate) fn repoint(id: &str, shard: &str) -> String {
    format!(
        "BEGIN; SET LOCAL shard_directory.allow_repoint = on; \
         UPDATE shard_directory.shard_directory SET shard_name = '{shard}' \
         WHERE entity_type = 'tenant' AND entity_id = '{id}'; COMMIT"
    )
}

/// Runs `sql` on database `db` of `cluster`; returns the directory's version after it.
pub(crate) async fn change_in(cluster: &Cluster, db: &str, sql: &str) -> i64 {
    let c = cluster.connect(db).await;
    c.batch_execute(sql).await.expect("a directory change");
    c.query_one("SELECT shard_directory.current_version()", &[])
        .await
        .expect("the version")
        .get(0)
}

pub(crate) async fn epoch_in(cluster: &Cluster, db: &str) -> String {
    cluster
        .connect(db)
        .await
        .query_one("SELECT shard_directory.directory_epoch()", &[])
        .await
        .expect("the directory's epoch")
        .get(0)
}

async fn shard_of(cluster: &Cluster, db: &str, id: &str) -> String {
    cluster
        .connect(db)
        .await
        .query_one(
            "SELECT shard_name FROM shard_directory.shard_directory \
             WHERE entity_type = 'tenant' AND entity_id = $1",
            &[&id],
        )
        .await
        .expect("the entry")
        .get(0)
}

/// `CREATE DATABASE <copy> TEMPLATE <db>` on `cluster`, retried while the source still has a
/// closing session.
pub(crate) async fn copy_database(cluster: &Cluster, db: &str, copy: &str) {
    let admin = cluster.connect("postgres").await;
    let sql = format!("CREATE DATABASE {copy} TEMPLATE {db}");
    eventually("the template copy", DEADLINE, || async {
        admin.batch_execute(&sql).await.ok()
    })
    .await;
}

/// For `for_` (a few seconds), `d`'s lookup of tenant `id` never names another shard than
/// `shard`: no layer brings back a lost entry, not even for a moment.
pub(crate) async fn never_says_otherwise(
    d: &Directory,
    id: &str,
    shard: &str,
    for_: Duration,
    what: &str,
) {
    let until = tokio::time::Instant::now() + for_;
    while tokio::time::Instant::now() < until {
        if let Ok(e) = d.lookup("tenant", id).await {
            assert_eq!(
                e.shard_name.as_str(),
                shard,
                "{what}: tenant {id} is on {shard} in the surviving directory, but the client \
                 routes it to {} (read at version {}; it knows version {}, stats {:?})",
                e.shard_name,
                e.directory_version,
                d.version(),
                d.stats()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Invariant 1, on the server alone: a database copied with `CREATE DATABASE ... TEMPLATE`
/// (a DBA's quick snapshot of the directory, on the same server) carries the version row as it
/// is, `lineage_minted_by` included, with the same system identifier and postmaster start; the
/// database in who minted it makes the copy's first change mint a lineage of its own, so the two
/// never name one `(epoch, version)` with two contents (they did, without the database).
#[tokio::test]
async fn a_template_copy_of_the_directory_goes_on_in_an_epoch_of_its_own() {
    let t = Topology::start("edges-template").await;
    let copied = t.add_tenants(2, "shard_1").await;
    let dir = &t.directory;
    copy_database(dir, DIRECTORY_DB, "directory_copy").await;
    assert_eq!(
        epoch_in(dir, DIRECTORY_DB).await,
        epoch_in(dir, "directory_copy").await,
        "a copy is the state it was copied at, until it changes"
    );

    let on_original = change_in(dir, DIRECTORY_DB, &repoint("1", "shard_2")).await;
    let on_copy = change_in(dir, "directory_copy", &repoint("2", "shard_2")).await;
    assert_eq!(on_original, copied + 1);
    assert_eq!(on_copy, copied + 1, "both at one version");
    let states = (
        (
            shard_of(dir, DIRECTORY_DB, "1").await,
            shard_of(dir, DIRECTORY_DB, "2").await,
        ),
        (
            shard_of(dir, "directory_copy", "1").await,
            shard_of(dir, "directory_copy", "2").await,
        ),
    );
    assert_ne!(states.0, states.1, "two different directory states");
    let (original, copy) = (
        epoch_in(dir, DIRECTORY_DB).await,
        epoch_in(dir, "directory_copy").await,
    );
    assert_ne!(
        original, copy,
        "two copies that each changed after diverging name version {on_copy} in one epoch \
         ({original}) with different contents: {states:?}"
    );
}

/// Invariant 2, through the shared cache: a DBA restores the directory from a same-server
/// template snapshot (drop the directory database, rename the snapshot to its name) and makes a
/// change, which numbers the lost version again, in an epoch of its own: a fresh instance
/// sharing the Redis in which an earlier instance put its read of the lost version does not take
/// that entry (tenant 1 on shard_2; the directory says shard_1), and its write lands where the
/// directory says (it was routed by the lost entry before).
#[tokio::test]
async fn a_snapshot_restored_by_rename_does_not_let_the_shared_cache_bring_back_a_lost_entry() {
    let redis = RedisServer::start().await;
    let t = Topology::start("edges-snapshot").await;
    let copied = t.add_tenants(2, "shard_1").await;
    let dir = &t.directory;
    copy_database(dir, DIRECTORY_DB, "directory_snapshot").await;

    let sharing = || {
        DirectoryConfig::default()
            .poll_interval(Duration::from_secs(1))
            .shared_cache(SharedCacheConfig::new(redis.url()))
    };
    let lost = {
        let d = t.client_directory(sharing()).await;
        assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
        let lost = change_in(dir, DIRECTORY_DB, &repoint("1", "shard_2")).await;
        assert_eq!(lost, copied + 1);
        reaches(&d, lost).await;
        let one = d.lookup("tenant", "1").await.unwrap();
        assert_eq!(
            (one.shard_name.as_str(), one.directory_version),
            ("shard_2", lost)
        );
        lost
    };

    // The restore: the snapshot takes the directory's name; then the DBA's first change.
    let admin = dir.connect("postgres").await;
    for step in [
        format!("DROP DATABASE {DIRECTORY_DB} WITH (FORCE)"),
        format!("ALTER DATABASE directory_snapshot RENAME TO {DIRECTORY_DB}"),
    ] {
        admin
            .batch_execute(&step)
            .await
            .expect("restore the snapshot");
    }
    let again = change_in(dir, DIRECTORY_DB, &repoint("2", "shard_2")).await;
    assert_eq!(
        again, lost,
        "the restored directory numbers the lost version again"
    );
    assert_eq!(t.placement("1").await, "shard_1");

    let fresh = t.client_directory(sharing()).await;
    assert_eq!(fresh.version(), lost);
    writes_land(&t, &t.router(fresh.clone()), "1", "from a fresh instance").await;
    says(&fresh, "1", "shard_1", "a fresh instance after the restore").await;
}

/// A restore from a base backup (one epoch with the lost versions: the restored server makes no
/// change before the client reads it), with a streaming standby read as a replica that had
/// replayed two lost versions (tenants 1 and 2 re-pointed to shard_2) and keeps answering at them
/// after the primary is restored. The client polls hourly: only its watcher's notifications and
/// reconnects tell it anything. It read the lost versions before the restore, or (`knew_lost`
/// false) it starts after the restore, as an instance started then, or one that went to another
/// epoch meanwhile, knows nothing of them.
pub(crate) struct ReplicaAhead {
    pub t: Topology,
    pub d: Directory,
    pub router: Router,
    pub copied: i64,
    pub lost: i64,
    _replica: Cluster,
}

pub(crate) async fn replica_ahead_of_a_restored_primary(
    name: &str,
    knew_lost: bool,
) -> ReplicaAhead {
    let t = Topology::start(name).await;
    let copied = t.add_tenants(2, "shard_1").await;
    let replica = t.streaming_standby(&format!("{name}-standby")).await;
    let config = DirectoryConfig::default()
        .poll_interval(Duration::from_secs(3600))
        .replica(replica.config(DIRECTORY_DB))
        .replica_wait(Duration::from_secs(2));
    let client = || connected_directory(t.directory_config(), config.clone());
    let before = match knew_lost {
        true => Some(client().await),
        false => None,
    };
    if let Some(d) = &before {
        assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    }

    let copy = t.directory.base_backup();
    change_in(&t.directory, DIRECTORY_DB, &repoint("1", "shard_2")).await;
    let lost = change_in(&t.directory, DIRECTORY_DB, &repoint("2", "shard_2")).await;
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
    if let Some(d) = &before {
        reaches(d, lost).await;
        assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_2");
    }

    t.directory.restore_cold_copy(&copy);
    assert_eq!(t.placement("1").await, "shard_1");
    let d = match before {
        Some(d) => d,
        None => client().await,
    };
    eventually(
        "the client to read the primary go back",
        DEADLINE * 2,
        || async { (d.version() == copied).then_some(()) },
    )
    .await;
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    ReplicaAhead {
        router: t.router(d.clone()),
        t,
        d,
        copied,
        lost,
        _replica: replica,
    }
}

/// The restored primary commits two changes in one transaction (tenants 3 and 4 added: its
/// first change mints a new lineage), and notifies both versions at once; returns the version.
async fn restored_primary_changes(a: &ReplicaAhead) -> i64 {
    let version = change_in(
        &a.t.directory,
        DIRECTORY_DB,
        "BEGIN; \
         INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', '3', 'shard_1'); \
         INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', '4', 'shard_1'); \
         COMMIT",
    )
    .await;
    assert_eq!(
        version, a.lost,
        "the restored primary numbers the lost versions again"
    );
    version
}

/// Invariant 2, through the replica: after the restored primary's first change and its
/// notification, the standby, still in recovery, in the old epoch and exactly at the notified
/// version, is not read. The client read the directory go back, so replicas are trusted only as
/// far as the primary's own reads (the standby was read, and the client routed tenant 1 to
/// shard_2 until its next poll).
#[tokio::test]
async fn a_notification_from_the_restored_primary_does_not_let_a_replica_serve_lost_versions() {
    after_the_restored_primarys_first_change("edges-notified", true).await;
}

/// Invariant 2, through the replica, for a client that never knew the lost versions and so never
/// saw the directory go back: the notification of the restored primary's first change names a
/// version of the new lineage, which the standby also answers at in the copy's epoch, the one the
/// client knows. The directory notifies the new epoch with it, so the standby is not read (it
/// was, and the client routed tenant 1 to shard_2: the randomized history's seed 2 found it).
#[tokio::test]
async fn a_notification_of_a_new_lineage_does_not_let_a_replica_serve_lost_versions() {
    after_the_restored_primarys_first_change("edges-minted", false).await;
}

/// The restored primary's first change heard; then tenant 1 is never routed by its lost entry.
async fn after_the_restored_primarys_first_change(name: &str, knew_lost: bool) {
    let a = replica_ahead_of_a_restored_primary(name, knew_lost).await;
    restored_primary_changes(&a).await;
    reaches(&a.d, a.lost).await;
    never_says_otherwise(
        &a.d,
        "1",
        "shard_1",
        Duration::from_secs(3),
        "after the restored primary's first change",
    )
    .await;
    writes_land(&a.t, &a.router, "1", "after the restore").await;
}

/// Invariant 2, through a forged notification: anyone who can connect may NOTIFY the
/// directory's channel. With the restored primary at the copy's version (no change yet, so one
/// epoch) and the client having read the version go back, a NOTIFY naming the lost version does
/// not lift the bound on replica reads: the standby still at it is not read (it was, and the
/// client went forward to the lost version and routed tenant 1 to shard_2).
#[tokio::test]
async fn a_forged_notify_after_a_regression_does_not_let_a_replica_serve_lost_versions() {
    let a = replica_ahead_of_a_restored_primary("edges-forged", true).await;
    let dba = a.t.dba().await;
    dba.batch_execute("CREATE ROLE nobody LOGIN; GRANT CONNECT ON DATABASE directory TO nobody")
        .await
        .unwrap();
    let mut config = a.t.directory_config();
    config.user("nobody");
    let (nobody, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    nobody
        .batch_execute(&format!(
            "NOTIFY {}, '{}'",
            shard_directory_protocol::CHANNEL,
            a.lost
        ))
        .await
        .unwrap();
    never_says_otherwise(
        &a.d,
        "1",
        "shard_1",
        Duration::from_secs(5),
        "after a forged NOTIFY",
    )
    .await;
    assert_eq!(
        a.d.version(),
        a.copied,
        "the directory is at {}: the client must not know a later version",
        a.copied
    );
}

/// Invariant 1, through a crash restart: the harness's directory commits asynchronously
/// (`synchronous_commit = off`), and a backend that dies makes the postmaster reset and run
/// crash recovery without restarting: `PgStartTime`, and so `lineage_minted_by`, stay as they
/// were. A directory change is flushed before it is visible whatever the setting, so no version
/// a client read is lost (one was, and the next change numbered it again in the same lineage: a
/// fresh instance took the lost entry from Redis and routed a write by it).
#[tokio::test]
async fn a_crash_restart_loses_no_version_a_client_read() {
    let redis = RedisServer::start().await;
    let t = Topology::start("edges-crash").await;
    let copied = t.add_tenants(2, "shard_1").await;
    let dir = &t.directory;
    let admin = dir.connect("postgres").await;
    // The WAL writer and background writer idle: an asynchronous commit stays in WAL buffers.
    for step in [
        "ALTER SYSTEM SET wal_writer_delay = '10s'",
        "ALTER SYSTEM SET bgwriter_lru_maxpages = 0",
        "ALTER SYSTEM SET autovacuum = off",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(step).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    admin.batch_execute("CHECKPOINT").await.unwrap();
    let started: String = admin
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .unwrap()
        .get(0);
    let victim: i32 = admin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);

    let sharing = DirectoryConfig::default()
        .poll_interval(Duration::from_secs(1))
        .shared_cache(SharedCacheConfig::new(redis.url()));
    let d = t.client_directory(sharing.clone()).await;
    let lost = change_in(dir, DIRECTORY_DB, &repoint("1", "shard_2")).await;
    assert_eq!(lost, copied + 1);
    let lost_epoch = epoch_in(dir, DIRECTORY_DB).await;
    reaches(&d, lost).await;
    let one = d.lookup("tenant", "1").await.unwrap();
    assert_eq!(
        (one.shard_name.as_str(), one.directory_version),
        ("shard_2", lost)
    );
    drop(d);

    // A backend dies: the postmaster resets and recovers, without restarting.
    let killed = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let admin = eventually("the directory to recover", DEADLINE * 2, || async {
        let (c, connection) = dir
            .config("postgres")
            .connect(tokio_postgres::NoTls)
            .await
            .ok()?;
        tokio::spawn(connection);
        c.query_one("SELECT 1", &[]).await.ok()?;
        Some(c)
    })
    .await;
    let after: String = admin
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, started, "a crash restart, not a new postmaster");
    let recovered = eventually("the directory database to answer", DEADLINE, || {
        answered_version(dir)
    })
    .await;
    assert_eq!(
        recovered, lost,
        "the change a client read was flushed before it was visible: not lost in the crash"
    );
    assert_eq!(t.placement("1").await, "shard_2");

    let next = change_in(dir, DIRECTORY_DB, &repoint("2", "shard_2")).await;
    assert_eq!(next, lost + 1, "no version is numbered again");
    assert_eq!(
        epoch_in(dir, DIRECTORY_DB).await,
        lost_epoch,
        "the same history"
    );
    let fresh = t.client_directory(sharing).await;
    assert_eq!(
        fresh.lookup("tenant", "1").await.unwrap().shard_name,
        "shard_2"
    );
    assert_eq!(
        fresh.lookup("tenant", "2").await.unwrap().shard_name,
        "shard_2"
    );
}

/// `directory_epoch()`, which every fill and every version read calls, reads the version table
/// as a SELECT does: a session holding a SHARE lock on the table (a DBA's `CREATE INDEX`, or
/// `LOCK ... IN SHARE MODE`) blocks neither (it opened the table for writing, and the router's
/// role, as docs/operations.md grants it, timed out).
#[tokio::test]
async fn reading_the_epoch_waits_for_no_lock_a_read_of_the_version_does_not() {
    let t = Topology::start("edges-lock").await;
    t.add_tenants(1, "shard_1").await;
    let router = t.router_role().await;
    let dba = t.dba().await;
    dba.batch_execute("BEGIN; LOCK TABLE shard_directory.shard_directory_version IN SHARE MODE")
        .await
        .unwrap();
    let (c, connection) = router.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    c.batch_execute("SET lock_timeout = '2s'").await.unwrap();
    c.query_one(
        "SELECT version FROM shard_directory.shard_directory_version WHERE id",
        &[],
    )
    .await
    .expect("a read of the version goes on");
    let epoch = c
        .query_one("SELECT shard_directory.directory_epoch()", &[])
        .await;
    assert!(
        epoch.is_ok(),
        "a read of the epoch waits for a SHARE lock on the version table: {epoch:?}"
    );
}
