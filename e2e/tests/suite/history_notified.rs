//! Notifications and replicas across restores, failovers and forgeries (issue 42, from the attack
//! on trusting a notified version only from its server in its epoch): a forged notification on
//! either channel, two changes heard at once, a database restored beside the directory by rename,
//! a failover and a crash restart. Replica reads stay safe (no lost entry routed) and stay in use
//! (a notified change is read on the standby, not the primary).

use std::time::Duration;

use crate::history::{replayed, says, writes_land};
use crate::history_edges::{
    change_in, copy_database, epoch_in, never_says_otherwise, replica_ahead_of_a_restored_primary,
    repoint,
};

use shard_directory_client::{Directory, DirectoryConfig, Stats};
use shard_directory_e2e::topology::{connected_directory, DIRECTORY_DB};
use shard_directory_e2e::{eventually, reaches, Cluster, Topology};
use shard_directory_protocol::{CHANNEL, EPOCH_CHANNEL, WATCHER_APPLICATION_NAME};

const DEADLINE: Duration = Duration::from_secs(15);

fn insert(id: &str) -> String {
    format!(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
         VALUES ('tenant', '{id}', 'shard_1')"
    )
}

/// A least-privileged login (CONNECT only) on the directory: it can NOTIFY anything.
async fn nobody(t: &Topology) -> tokio_postgres::Client {
    t.dba()
        .await
        .batch_execute("CREATE ROLE nobody LOGIN; GRANT CONNECT ON DATABASE directory TO nobody")
        .await
        .unwrap();
    let mut config = t.directory_config();
    config.user("nobody");
    let (c, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    c
}

async fn forge(nobody: &tokio_postgres::Client, channel: &str, payload: &str) {
    nobody
        .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
        .await
        .expect("a forged NOTIFY");
}

fn replica_reads(d: &Directory, before: &Stats) -> (u64, u64) {
    let now = d.stats();
    (
        now.replica_reads - before.replica_reads,
        now.replica_fallbacks - before.replica_fallbacks,
    )
}

/// SIGSTOPs a process until dropped (SIGCONT).
struct Stopped(String);

impl Stopped {
    fn new(pid: i32) -> Stopped {
        let pid = pid.to_string();
        assert!(std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success());
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0])
            .status();
    }
}

async fn watcher_pid(cluster: &Cluster) -> i32 {
    cluster
        .connect(DIRECTORY_DB)
        .await
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&WATCHER_APPLICATION_NAME],
        )
        .await
        .expect("one watcher session")
        .get(0)
}

/// Invariant 2, with the restored primary's real changes: its first change (which mints a
/// lineage: `v <new>` on the epoch channel, then `v`) and a second one commit, and between them
/// anyone NOTIFYs `shard_directory_epoch` naming the copy's epoch (the one the client and the
/// standby left on the lost history are in). The watcher takes the three transactions'
/// notifications at once (its backend was busy: here, SIGSTOPped). An epoch notification only
/// says that the versions after it are of a history the session has not read: the second, real,
/// version is not taken as the copy's epoch, and the standby is not read at it (it was: the
/// forged line labelled it the copy's epoch, and the client routed tenant 1 to shard_2).
#[tokio::test]
async fn a_forged_epoch_notification_between_two_changes_does_not_let_a_replica_serve_lost_versions(
) {
    two_changes_heard_at_once("notified-epoch-relabel", true).await;
}

/// The test above without the forged line: two real changes of a new lineage heard at once.
#[tokio::test]
async fn two_real_changes_of_a_new_lineage_heard_at_once_are_safe() {
    two_changes_heard_at_once("notified-epoch-control", false).await;
}

async fn two_changes_heard_at_once(name: &str, forged: bool) {
    let a = replica_ahead_of_a_restored_primary(name, false).await;
    let old_epoch = epoch_in(&a.t.directory, DIRECTORY_DB).await;
    let nobody = nobody(&a.t).await;
    let pid = watcher_pid(&a.t.directory).await;
    let (first, second) = {
        let _stopped = Stopped::new(pid);
        let first = change_in(&a.t.directory, DIRECTORY_DB, &insert("3")).await;
        assert_eq!(first, a.copied + 1);
        assert_ne!(
            epoch_in(&a.t.directory, DIRECTORY_DB).await,
            old_epoch,
            "the first change minted"
        );
        if forged {
            forge(
                &nobody,
                EPOCH_CHANNEL.as_str(),
                &format!("{first} {old_epoch}"),
            )
            .await;
        }
        let second = change_in(&a.t.directory, DIRECTORY_DB, &insert("4")).await;
        assert_eq!(
            second, a.lost,
            "the restored primary numbers the lost version again"
        );
        (first, second)
    };
    let _ = first;
    reaches(&a.d, second).await;
    never_says_otherwise(
        &a.d,
        "1",
        "shard_1",
        Duration::from_secs(3),
        "after a forged epoch line between the restored primary's changes",
    )
    .await;
    writes_land(&a.t, &a.router, "1", "after the forged epoch line").await;
}

/// Until `d`'s watcher is connected again.
async fn reconnected(d: &Directory) {
    eventually("the watcher to reconnect", DEADLINE * 2, || async {
        d.is_connected().then_some(())
    })
    .await;
}

/// A topology with a streaming standby read as a replica, and a client reading on it.
async fn with_standby(name: &str) -> (Topology, Cluster, Directory) {
    let t = Topology::start(name).await;
    t.add_tenants(4, "shard_1").await;
    let standby = t.streaming_standby(&format!("{name}-standby")).await;
    let config = DirectoryConfig::default()
        .replica(standby.config(DIRECTORY_DB))
        .replica_wait(Duration::from_secs(2));
    let d = connected_directory(t.directory_config(), config).await;
    (t, standby, d)
}

/// A new tenant (a directory change): the client learns it, and the notified change is read on
/// the replica (the watcher's read of what changed, then the fill), none made on the primary.
async fn read_on_the_replica(t: &Topology, d: &Directory, id: &str, what: &str) {
    let before = d.stats();
    let v = t.add_tenant(id, "shard_1").await;
    reaches(d, v).await;
    assert_eq!(
        d.lookup("tenant", id).await.unwrap().shard_name,
        "shard_1",
        "{what}"
    );
    assert_eq!(
        replica_reads(d, &before),
        (2, 0),
        "{what}: change {v} should be read on the replica (reads, fallbacks); stats {:?}",
        d.stats()
    );
}

/// Invariants 2 and 3: junk on the epoch channel (no space, empty, a space only, an empty epoch,
/// a huge payload, the current epoch, another epoch, a huge version) never wedges the watcher:
/// each real change after it is learned, and the one after that is read on the replica again.
#[tokio::test]
async fn junk_on_the_epoch_channel_neither_wedges_the_watcher_nor_stops_replica_reads() {
    let (t, _standby, d) = with_standby("notified-epoch-junk").await;
    read_on_the_replica(&t, &d, "100", "before any forgery").await;
    let epoch = epoch_in(&t.directory, DIRECTORY_DB).await;
    let nobody = nobody(&t).await;
    let payloads = [
        String::new(),
        "nospace".to_owned(),
        " ".to_owned(),
        "12 ".to_owned(),
        format!("1 {}", "x".repeat(7000)),
        format!("1 {epoch}"),
        "1 1.bogus".to_owned(),
        format!("9223372036854775807 {epoch}"),
        format!("-1 {epoch} trailing"),
    ];
    for (i, payload) in payloads.iter().enumerate() {
        let what = format!(
            "after {:?} on the epoch channel",
            &payload[..payload.len().min(40)]
        );
        forge(&nobody, EPOCH_CHANNEL.as_str(), payload).await;
        let before = d.stats();
        let v = t.add_tenant(&format!("2{i:02}"), "shard_1").await;
        reaches(&d, v).await;
        eprintln!(
            "{what}: the next change's (reads, fallbacks) = {:?}",
            replica_reads(&d, &before)
        );
        read_on_the_replica(&t, &d, &format!("3{i:02}"), &what).await;
    }
}

/// Invariant 2: a forged version far ahead on `shard_directory` (the replica waits, then the
/// primary is read) does not stop later real changes from being learned and read on the
/// replica, nor lets the client know a version the directory has not reached.
#[tokio::test]
async fn a_forged_huge_version_leaves_the_watcher_learning_on_the_replica() {
    let (t, _standby, d) = with_standby("notified-huge").await;
    read_on_the_replica(&t, &d, "100", "before any forgery").await;
    let nobody = nobody(&t).await;
    let known = d.version();
    forge(&nobody, CHANNEL.as_str(), &i64::MAX.to_string()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(d.version(), known, "nothing changed");
    read_on_the_replica(&t, &d, "101", "after a forged huge version").await;
    read_on_the_replica(&t, &d, "102", "after a forged huge version, again").await;
}

/// Invariant 3 across a failover: the primary crashes, a standby is promoted and takes the
/// primary's address (another server), the reader standby is rebuilt to follow it. After the
/// promoted server's first change (which mints a lineage), notified changes are read on the
/// replica again, as before the failover.
#[tokio::test]
async fn after_a_failover_notified_changes_are_read_on_the_replica_again() {
    let (t, reader, d) = with_standby("notified-failover").await;
    read_on_the_replica(&t, &d, "100", "before the failover").await;
    let promoted = t.directory.standby("notified-failover-promoted");
    let v = t.add_tenant("101", "shard_1").await;
    replayed(&promoted, v).await;
    reaches(&d, v).await;
    let before_epoch = epoch_in(&t.directory, DIRECTORY_DB).await;
    t.directory.crash();
    promoted.promote();
    t.directory.take_over(&promoted);
    reader.follow(&t.directory);
    reconnected(&d).await;
    let first = t.add_tenant("102", "shard_1").await;
    reaches(&d, first).await;
    assert_ne!(
        epoch_in(&t.directory, DIRECTORY_DB).await,
        before_epoch,
        "a new lineage"
    );
    says(&d, "102", "shard_1", "the promoted server's first change").await;
    replayed(&reader, first).await;
    read_on_the_replica(&t, &d, "103", "after the failover").await;
    read_on_the_replica(&t, &d, "104", "after the failover, again").await;
}

/// Invariant 3 across a crash restart (a backend killed: the postmaster resets, its start time
/// kept, so the same server, the same lineage): notified changes are still read on the replica.
#[tokio::test]
async fn after_a_crash_restart_notified_changes_are_read_on_the_replica() {
    let (t, standby, d) = with_standby("notified-crash").await;
    read_on_the_replica(&t, &d, "100", "before the crash").await;
    let epoch = epoch_in(&t.directory, DIRECTORY_DB).await;
    let admin = t.directory.connect("postgres").await;
    let victim: i32 = admin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap()
        .success());
    eventually("the directory to recover", DEADLINE * 2, || async {
        let (c, connection) = t
            .directory
            .config(DIRECTORY_DB)
            .connect(tokio_postgres::NoTls)
            .await
            .ok()?;
        tokio::spawn(connection);
        c.query_one("SELECT 1", &[]).await.ok()?;
        Some(())
    })
    .await;
    reconnected(&d).await;
    let v = t.add_tenant("101", "shard_1").await;
    reaches(&d, v).await;
    assert_eq!(
        epoch_in(&t.directory, DIRECTORY_DB).await,
        epoch,
        "the same lineage"
    );
    replayed(&standby, v).await;
    read_on_the_replica(&t, &d, "102", "after the crash restart").await;
}

/// Invariant 1, no forgery: a restore on the same server (a DBA's template snapshot renamed into
/// the directory's place) keeps the postmaster and, until its first change, the epoch. A version
/// notified just before it (the lost one), which the watcher heard but could not read (its
/// replica was behind, then the restore ended its session), was heard from another database: it
/// is not trusted after the restore, and a standby whose replay stopped just after the lost
/// change is not read at it (it was, while the server's identity was its postmaster's start
/// alone, and the client routed tenant 1 to shard_2).
#[tokio::test]
async fn a_version_notified_before_a_restore_by_rename_does_not_let_a_lagging_standby_serve_it() {
    let t = Topology::start("notified-rename").await;
    let copied = t.add_tenants(3, "shard_1").await;
    let standby = t.streaming_standby("notified-rename-standby").await;
    replayed(&standby, copied).await;
    copy_database(&t.directory, DIRECTORY_DB, "directory_snapshot").await;
    let config = DirectoryConfig::default()
        .poll_interval(Duration::from_secs(3600))
        .replica(standby.config(DIRECTORY_DB))
        .replica_wait(Duration::from_secs(6));
    let d = connected_directory(t.directory_config(), config).await;
    assert_eq!(d.version(), copied);
    let epoch = epoch_in(&t.directory, DIRECTORY_DB).await;

    // The standby's replay stops (a lagging standby): the watcher's read of the next change
    // waits for it.
    let on_standby = standby.connect(DIRECTORY_DB).await;
    on_standby
        .batch_execute("SELECT pg_wal_replay_pause()")
        .await
        .unwrap();
    eventually("the replay to pause", DEADLINE, || async {
        let state: String = on_standby
            .query_one("SELECT pg_get_wal_replay_pause_state()", &[])
            .await
            .ok()?
            .get(0);
        (state == "paused").then_some(())
    })
    .await;
    let data_directory: String = on_standby
        .query_one("SHOW data_directory", &[])
        .await
        .unwrap()
        .get(0);
    drop(on_standby);

    let dba = t.dba().await;
    dba.batch_execute(&repoint("1", "shard_2")).await.unwrap();
    let lost: i64 = dba
        .query_one("SELECT shard_directory.current_version()", &[])
        .await
        .unwrap()
        .get(0);
    let lsn: String = dba
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    drop(dba);
    assert_eq!(lost, copied + 1);
    // The watcher hears it, and waits for the standby.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The restore, on the same server: the snapshot takes the directory's name.
    let admin = t.directory.connect("postgres").await;
    for step in [
        format!("DROP DATABASE {DIRECTORY_DB} WITH (FORCE)"),
        format!("ALTER DATABASE directory_snapshot RENAME TO {DIRECTORY_DB}"),
    ] {
        admin
            .batch_execute(&step)
            .await
            .expect("restore the snapshot");
    }
    assert_eq!(t.placement("1").await, "shard_1");
    assert_eq!(
        epoch_in(&t.directory, DIRECTORY_DB).await,
        epoch,
        "the copy's epoch, until it changes"
    );
    // The watcher's wait ends, its read of the primary fails (the session was ended), it
    // reconnects and reads the restored directory: at the version it knows, nothing went back.
    tokio::time::sleep(Duration::from_secs(8)).await;
    reconnected(&d).await;
    assert_eq!(
        d.version(),
        copied,
        "the client never knew the lost version"
    );

    // The standby replays up to the lost change and stops there (a standby that lags, or a
    // DBA's recovery target), in recovery.
    standby.stop();
    std::fs::OpenOptions::new()
        .append(true)
        .open(format!("{data_directory}/postgresql.conf"))
        .and_then(|mut f| {
            std::io::Write::write_all(
                &mut f,
                format!("\nrecovery_target_lsn = '{lsn}'\nrecovery_target_action = 'pause'\n")
                    .as_bytes(),
            )
        })
        .expect("the standby's recovery target");
    standby.restart();
    replayed(&standby, lost).await;
    assert_eq!(
        epoch_in(&standby, DIRECTORY_DB).await,
        epoch,
        "the standby: the copy's epoch too"
    );

    // Lookups: a fill of keys nobody has (the replica pool reconnects), then tenant 1.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut i = 0;
    while tokio::time::Instant::now() < until {
        i += 1;
        let _ = d.lookup("tenant", &format!("probe-{i}")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    never_says_otherwise(
        &d,
        "1",
        "shard_1",
        Duration::from_secs(3),
        "after a same-server restore with a lagging standby",
    )
    .await;
    assert_eq!(d.version(), copied, "the directory is at {copied}");
}
