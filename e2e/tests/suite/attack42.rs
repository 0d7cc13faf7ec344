//! Attacks on issue 42 ("One history"): where `(epoch, version)` still names two states of the
//! directory, and where a layer still brings back a version the surviving primary no longer has.
//! Each test fails against the change as it stands (a9223c3).

use std::time::Duration;

use shard_directory_client::{Directory, DirectoryConfig, Router, SharedCacheConfig};
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::topology::{connected_directory, DIRECTORY_DB};
use shard_directory_e2e::{eventually, reaches, within, Cluster, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

/// Re-points tenant `id` to `shard` as a DBA does in an emergency.
fn repoint(id: &str, shard: &str) -> String {
    format!(
        "BEGIN; SET LOCAL shard_directory.allow_repoint = on; \
         UPDATE shard_directory.shard_directory SET shard_name = '{shard}' \
         WHERE entity_type = 'tenant' AND entity_id = '{id}'; COMMIT"
    )
}

/// Runs `sql` on database `db` of `cluster`; returns the directory's version after it.
async fn change_in(cluster: &Cluster, db: &str, sql: &str) -> i64 {
    let c = cluster.connect(db).await;
    c.batch_execute(sql).await.expect("a directory change");
    c.query_one("SELECT shard_directory.current_version()", &[])
        .await
        .expect("the version")
        .get(0)
}

async fn epoch_in(cluster: &Cluster, db: &str) -> String {
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
async fn copy_database(cluster: &Cluster, db: &str, copy: &str) {
    let admin = cluster.connect("postgres").await;
    let sql = format!("CREATE DATABASE {copy} TEMPLATE {db}");
    eventually("the template copy", DEADLINE, || async {
        admin.batch_execute(&sql).await.ok()
    })
    .await;
}

/// Waits (up to [`DEADLINE`]) until `d`'s lookup of tenant `id` names `shard`.
async fn says(d: &Directory, id: &str, shard: &str, what: &str) {
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

/// For `for_` (a few seconds), `d`'s lookup of tenant `id` never names another shard than
/// `shard`: no layer brings back a lost entry, not even for a moment.
async fn never_says_otherwise(d: &Directory, id: &str, shard: &str, for_: Duration, what: &str) {
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

/// A write for tenant `id` routed by `router` lands on the shard the directory names, and
/// nowhere else.
async fn writes_land(t: &Topology, router: &Router, id: &str, item: &str) {
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

/// Invariant 1, on the server alone: a database copied with `CREATE DATABASE ... TEMPLATE`
/// (a DBA's quick snapshot of the directory, on the same server) carries the version row as it
/// is, `lineage_minted_by` included. Same system identifier, same postmaster start: neither copy's
/// first change mints a lineage, and the two go on apart under one epoch, naming one
/// `(epoch, version)` with two different contents.
#[tokio::test]
async fn attack42_a_template_copy_of_the_directory_goes_on_in_the_same_epoch() {
    let t = Topology::start("attack42-template").await;
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
/// change, which numbers the lost version again in the lost epoch. A fresh instance sharing the
/// Redis in which an earlier instance put its read of the lost version takes that entry (tenant
/// 1 on shard_2; the directory says shard_1) as current, and routes the write there.
#[tokio::test]
async fn attack42_a_snapshot_restored_by_rename_lets_the_shared_cache_bring_back_a_lost_entry() {
    let redis = RedisServer::start().await;
    let t = Topology::start("attack42-snapshot").await;
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
        admin.batch_execute(&step).await.expect("restore the snapshot");
    }
    let again = change_in(dir, DIRECTORY_DB, &repoint("2", "shard_2")).await;
    assert_eq!(again, lost, "the restored directory numbers the lost version again");
    assert_eq!(t.placement("1").await, "shard_1");

    let fresh = t.client_directory(sharing()).await;
    assert_eq!(fresh.version(), lost);
    writes_land(&t, &t.router(fresh.clone()), "1", "from a fresh instance").await;
    says(&fresh, "1", "shard_1", "a fresh instance after the restore").await;
}

/// The application before a restore from a base backup (one epoch with the lost versions: the
/// restored server makes no change before the client reads it), with a streaming standby read
/// as a replica that had replayed two lost versions (tenants 1 and 2 re-pointed to shard_2) and
/// keeps answering at them after the primary is restored. The client polls hourly: only its
/// watcher's notifications and reconnects tell it anything.
struct ReplicaAhead {
    t: Topology,
    d: Directory,
    router: Router,
    copied: i64,
    lost: i64,
    _replica: Cluster,
}

async fn replica_ahead_of_a_restored_primary(name: &str) -> ReplicaAhead {
    let t = Topology::start(name).await;
    let copied = t.add_tenants(2, "shard_1").await;
    let replica = t.streaming_standby(&format!("{name}-standby")).await;
    let config = DirectoryConfig::default()
        .poll_interval(Duration::from_secs(3600))
        .replica(replica.config(DIRECTORY_DB))
        .replica_wait(Duration::from_secs(2));
    let d = connected_directory(t.directory_config(), config).await;
    let router = t.router(d.clone());
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");

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
    eventually("the standby to replay", DEADLINE * 2, || async {
        let (c, connection) = replica
            .config(DIRECTORY_DB)
            .connect(tokio_postgres::NoTls)
            .await
            .ok()?;
        tokio::spawn(connection);
        let v: i64 = c
            .query_one("SELECT shard_directory.current_version()", &[])
            .await
            .ok()?
            .get(0);
        (v >= lost).then_some(())
    })
    .await;
    reaches(&d, lost).await;
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_2");

    t.directory.restore_cold_copy(&copy);
    assert_eq!(t.placement("1").await, "shard_1");
    eventually(
        "the client to read the primary go back",
        DEADLINE * 2,
        || async { (d.version() == copied).then_some(()) },
    )
    .await;
    assert_eq!(d.lookup("tenant", "1").await.unwrap().shard_name, "shard_1");
    ReplicaAhead {
        t,
        d,
        router,
        copied,
        lost,
        _replica: replica,
    }
}

/// Invariant 2, through the replica: the restored primary commits two changes in one
/// transaction (tenants 3 and 4 added: its first change mints a new lineage), and notifies both
/// versions at once. The watcher takes the highest notified version as "what the primary said"
/// in the epoch the primary said *before* (`Store::primary_notified` keeps the old epoch), so
/// the standby, still in recovery, still in the old epoch, exactly at that version, is read: the
/// client applies the lost versions and routes tenant 1 to shard_2 until its next poll.
#[tokio::test]
async fn attack42_a_notification_from_the_restored_primary_lets_a_replica_serve_lost_versions() {
    let a = replica_ahead_of_a_restored_primary("attack42-notified").await;
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
    assert_eq!(version, a.lost, "the restored primary numbers the lost versions again");
    reaches(&a.d, a.lost).await;
    never_says_otherwise(
        &a.d,
        "1",
        "shard_1",
        Duration::from_secs(3),
        "after the restored primary's notification",
    )
    .await;
    writes_land(&a.t, &a.router, "1", "after the restore").await;
}

/// Invariant 2, through a forged notification: anyone who can connect may NOTIFY the
/// directory's channel, and the watcher now takes the payload as a version the primary said
/// (`primary_notified`), which lifts the bound on replica reads. With the restored primary at
/// the copy's version (no change yet, so one epoch), a NOTIFY naming the lost version makes the
/// watcher read the standby that is still at it: the client goes forward to the lost version
/// and routes tenant 1 to shard_2 until its next poll.
#[tokio::test]
async fn attack42_a_forged_notify_lets_a_replica_serve_versions_the_primary_lost() {
    let a = replica_ahead_of_a_restored_primary("attack42-forged").await;
    let dba = a.t.dba().await;
    dba.batch_execute(
        "CREATE ROLE nobody LOGIN; GRANT CONNECT ON DATABASE directory TO nobody",
    )
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
/// (`synchronous_commit = off`, which docs/operations.md allows for), and a backend that dies
/// makes the postmaster reset and run crash recovery without restarting: `PgStartTime`, and so
/// `lineage_minted_by`, stay as they were. The commit that was not yet on disk is lost, clients
/// had read it (notifications and reads come at commit), and the recovered directory's next
/// change numbers the lost version again in the same lineage: one `(epoch, version)`, two
/// contents; a fresh instance takes the lost entry from Redis and routes a write by it.
#[tokio::test]
async fn attack42_a_crash_restart_that_loses_a_commit_reuses_its_version_in_the_same_epoch() {
    let redis = RedisServer::start().await;
    let t = Topology::start("attack42-crash").await;
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
    assert_eq!((one.shard_name.as_str(), one.directory_version), ("shard_2", lost));
    drop(d);

    // A backend dies: the postmaster resets and recovers, without restarting.
    let killed = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let admin = eventually("the directory to recover", DEADLINE * 2, || async {
        let (c, connection) = dir.config("postgres").connect(tokio_postgres::NoTls).await.ok()?;
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
    let recovered = eventually("the directory database to answer", DEADLINE, || async {
        let (c, connection) = dir.config(DIRECTORY_DB).connect(tokio_postgres::NoTls).await.ok()?;
        tokio::spawn(connection);
        let v: i64 = c
            .query_one("SELECT shard_directory.current_version()", &[])
            .await
            .ok()?
            .get(0);
        Some(v)
    })
    .await;
    assert_eq!(
        recovered, copied,
        "precondition: the asynchronous commit of version {lost} was lost in the crash"
    );
    assert_eq!(t.placement("1").await, "shard_1");

    let again = change_in(dir, DIRECTORY_DB, &repoint("2", "shard_2")).await;
    assert_eq!(again, lost, "the recovered directory numbers the lost version again");
    let epoch = epoch_in(dir, DIRECTORY_DB).await;
    let fresh = t.client_directory(sharing).await;
    assert_eq!(fresh.version(), lost);
    let one = fresh.lookup("tenant", "1").await.unwrap();
    assert!(
        epoch != lost_epoch && one.shard_name.as_str() == "shard_1",
        "version {lost} names two states in epoch {epoch} (lost: {lost_epoch}); a fresh \
         instance routes tenant 1 to {} (the directory: shard_1)",
        one.shard_name
    );
}

/// Regression: `directory_epoch()`, which every fill and every version read calls, opens the
/// version table for writing (`heap::read_singleton_text` uses `Table::open`, RowExclusiveLock,
/// not `open_to_read`). A session holding a SHARE lock on the table (a DBA's `CREATE INDEX`, or
/// `LOCK ... IN SHARE MODE`) then blocks every client's reads, though a plain read of the same
/// row goes on: here the router's role, as docs/operations.md grants it, times out.
#[tokio::test]
async fn attack42_reading_the_epoch_waits_behind_a_share_lock_that_reads_of_the_version_do_not() {
    let t = Topology::start("attack42-lock").await;
    t.add_tenants(1, "shard_1").await;
    let router = t.router_role().await;
    let dba = t.dba().await;
    dba.batch_execute(
        "BEGIN; LOCK TABLE shard_directory.shard_directory_version IN SHARE MODE",
    )
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
