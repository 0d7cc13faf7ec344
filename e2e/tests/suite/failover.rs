//! The directory fails over under load: a primary with a synchronous standby, routers and the
//! mover given both hosts (`target_session_attrs=read-write`), and the primary crashed and the
//! standby promoted while writers write and a move is under way, in its copy or in its freeze.
//! The routers converge within a bound, the move goes on by itself, and no acknowledged write is
//! lost or lands on a shard the directory does not name.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_client::{DirectoryConfig, EntityKey};
use shard_directory_e2e::observe::{self, At};
use shard_directory_e2e::topology::{connected_directory, DIRECTORY_DB};
use shard_directory_e2e::workload::{Audit, Ledger, Workload};
use shard_directory_e2e::{eventually, Cluster, Topology};
use shard_directory_mover::{
    Failure, MethodChoice, MoveOptions, MoveRecord, Mover, Overrides, Phase,
};
use tokio::sync::oneshot;

const DEADLINE: Duration = Duration::from_secs(30);

/// How long routers may take to follow the promotion.
const CONVERGED: Duration = Duration::from_secs(15);

/// A streaming standby of the directory that every commit waits for, and a connection config
/// naming both servers, the read-write one wanted.
async fn synchronous_standby(t: &Topology, name: &str) -> (Cluster, tokio_postgres::Config) {
    let standby = t.directory.standby(name);
    let primary = t.directory.connect(DIRECTORY_DB).await;
    // The harness's clusters run with synchronous_commit off: on, as a directory should.
    for step in [
        "ALTER SYSTEM SET synchronous_commit = on",
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "SELECT pg_reload_conf()",
    ] {
        primary.batch_execute(step).await.unwrap();
    }
    eventually("the standby to be synchronous", DEADLINE, || async {
        let sync: i64 = primary
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                &[],
            )
            .await
            .ok()?
            .get(0);
        (sync == 1).then_some(())
    })
    .await;
    let both = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname={DIRECTORY_DB} \
         target_session_attrs=read-write connect_timeout=2",
        t.directory.port(),
        standby.port()
    )
    .parse()
    .unwrap();
    (standby, both)
}

/// Crashes the directory's primary and promotes `standby`; returns when.
fn fail_over(t: &Topology, standby: &Cluster) -> Instant {
    crash(t);
    standby.promote();
    Instant::now()
}

/// Crashes the directory's primary. Its address then closes every connection, as a dead host's
/// refuses them: the tests of the suite run side by side, and another's cluster could otherwise
/// start on the freed port and answer in its place (with a directory of its own).
fn crash(t: &Topology) {
    t.directory.crash();
    let dead = std::net::TcpListener::bind(("127.0.0.1", t.directory.port()))
        .expect("hold the crashed primary's port");
    std::thread::spawn(move || {
        for connection in dead.incoming() {
            drop(connection);
        }
    });
}

struct Fleet {
    routers: Vec<Arc<shard_directory_client::Router>>,
    workload: Workload,
}

/// Two routers on `both`, writing to `tenants` (seeded `rows` orders each on shard_1).
async fn fleet(t: &Topology, both: &tokio_postgres::Config, tenants: &[&str], rows: i64) -> Fleet {
    let mut ledger = Ledger::default();
    for tenant in tenants {
        t.add_tenant(tenant, "shard_1").await;
        for item in t.seed_orders("shard_1", tenant, rows, 1).await {
            ledger.acked.insert(item, tenant.to_string());
        }
    }
    let second = Duration::from_secs(1);
    let config = DirectoryConfig::default()
        .connect_timeout(second)
        .query_timeout(second)
        .max_reconnect_backoff(Duration::from_millis(200));
    let mut routers = Vec::new();
    for _ in 0..2 {
        let d = connected_directory(both.clone(), config.clone()).await;
        routers.push(Arc::new(t.router(d)));
    }
    let workload = Workload::start(
        &routers,
        tenants,
        2,
        Duration::from_millis(3),
        fastrand::u64(..),
        ledger,
    );
    Fleet { routers, workload }
}

fn acked(w: &Workload, tenant: &str) -> usize {
    w.ledger().acked.values().filter(|t| *t == tenant).count()
}

/// When every router's watcher is connected again and has read the new primary's timeline
/// (polled, until [`DEADLINE`]).
fn converged(routers: &[Arc<shard_directory_client::Router>]) -> tokio::task::JoinHandle<Instant> {
    let routers = routers.to_vec();
    tokio::spawn(async move {
        eventually(
            "the routers to follow the promotion",
            DEADLINE * 2,
            || async {
                routers
                    .iter()
                    .all(|r| {
                        r.directory().is_connected() && r.directory().stats().epoch_changes == 1
                    })
                    .then(Instant::now)
            },
        )
        .await
    })
}

/// After the move of tenant `m` to shard_2 through the failover (`t`'s directory now the promoted
/// standby): it finished by itself, saying it waited for the directory; the routers followed the
/// promotion within [`CONVERGED`] and kept writing `m`; every acknowledged write is once where
/// the directory says.
async fn after_failover(
    t: &Topology,
    fleet: Fleet,
    (moved, notes): (Result<MoveRecord, Failure>, Vec<String>),
    (promoted, converged): (Instant, tokio::task::JoinHandle<Instant>),
) {
    let tenant = "m";
    let record = moved.unwrap_or_else(|e| panic!("the move through the failover: {e}"));
    assert_eq!(record.phase, Phase::Done);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("the directory stopped answering")),
        "{notes:?}"
    );
    assert_eq!(t.placement(tenant).await, "shard_2");
    let converged = converged.await.unwrap().saturating_duration_since(promoted);
    println!("failover: the routers followed the promotion in {converged:?}");
    assert!(converged < CONVERGED, "{converged:?}");
    let before = acked(&fleet.workload, tenant);
    eventually("the moved tenant written again", DEADLINE, || async {
        (acked(&fleet.workload, tenant) > before + 20).then_some(())
    })
    .await;
    let ledger = fleet.workload.stop().await;
    let audit = Audit::of(t, &ledger).await;
    assert!(audit.holds(), "{}", audit.problems());
    assert!(ledger.fatal.is_empty(), "{:?}", ledger.fatal);
    assert!(t.replication_objects().await.is_empty());
    let open: i64 = t
        .step("SELECT count(*) FROM shard_directory.shard_moves WHERE finished_at IS NULL")
        .await;
    assert_eq!(open, 0, "no move left open");
}

/// The directory's primary crashes as the move enters its freeze; the mover reaches the
/// promoted standby and finishes the move itself.
#[tokio::test]
async fn a_directory_failover_in_the_freeze_under_writers_and_the_move_finishes_itself() {
    let mut t = Topology::start("failover-freeze").await;
    let (mut standby, both) = synchronous_standby(&t, "failover-freeze-standby").await;
    let fleet = fleet(&t, &both, &["a", "b", "m"], 2_000).await;
    eventually("writes for every tenant", DEADLINE, || async {
        ["a", "b", "m"]
            .iter()
            .all(|x| acked(&fleet.workload, x) > 2_010)
            .then_some(())
    })
    .await;

    // The observer's action must be 'static: it hands the test a way to say it is done, and
    // the move waits in its freeze until the test has crashed the primary and promoted.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let act = observe::act_at(At::Phase(Phase::Frozen), move || {
        let tx = tx.clone();
        Box::pin(async move {
            let (done, wait) = oneshot::channel();
            if tx.send(done).is_ok() {
                let _ = wait.await;
            }
        })
    });
    let options = MoveOptions {
        method: MethodChoice::Copy,
        ..Default::default()
    };
    let mover = Mover::new(both.clone(), Overrides::default(), options).with_observer(act.clone());
    let key = EntityKey::new("tenant", "m");
    let watch = converged(&fleet.routers);
    let (moved, promoted) = {
        // Once: the resumed move enters its freeze again, and finds nobody listening.
        let crasher = async {
            let mut rx = rx;
            let done = rx.recv().await.expect("the move reaches its freeze");
            let promoted = fail_over(&t, &standby);
            let _ = done.send(());
            promoted
        };
        tokio::join!(mover.start(&key, "shard_2"), crasher)
    };
    // The promoted standby is the directory from now on.
    std::mem::swap(&mut t.directory, &mut standby);
    after_failover(&t, fleet, (moved, act.notes()), (promoted, watch)).await;
}

/// The directory's primary crashes in the middle of a paced initial copy (rows streaming into
/// the target, seen in `pg_stat_progress_copy`); the mover reaches the promoted standby, copies
/// again from a new snapshot and finishes the move itself.
#[tokio::test]
async fn a_directory_failover_inside_the_copy_under_writers_and_the_move_finishes_itself() {
    let mut t = Topology::start("failover-copy").await;
    let (mut standby, both) = synchronous_standby(&t, "failover-copy-standby").await;
    let fleet = fleet(&t, &both, &["a", "m"], 10_000).await;
    let options = MoveOptions {
        method: MethodChoice::Logical,
        max_rate: Some(5_000),
        ..Default::default()
    };
    let act = observe::act_at(At::Phase(Phase::Done), || Box::pin(async {}));
    let mover = Mover::new(both.clone(), Overrides::default(), options).with_observer(act.clone());
    let key = EntityKey::new("tenant", "m");
    let watch = converged(&fleet.routers);
    let (moved, promoted) = {
        let crasher = async {
            let target = t.shard("shard_2").await;
            eventually("the copy to be under way", DEADLINE, || async {
                let copied: i64 = target
                    .query_one(
                        "SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy",
                        &[],
                    )
                    .await
                    .ok()?
                    .get(0);
                (copied > 2_000).then_some(())
            })
            .await;
            fail_over(&t, &standby)
        };
        tokio::join!(mover.start(&key, "shard_2"), crasher)
    };
    std::mem::swap(&mut t.directory, &mut standby);
    after_failover(&t, fleet, (moved, act.notes()), (promoted, watch)).await;
}

/// A move asked for while the directory is down (its primary crashed, the standby not yet
/// promoted) is recorded and made once the standby is promoted, without anyone asking again.
#[tokio::test]
async fn a_move_asked_for_while_the_directory_fails_over_begins_once_it_is_promoted() {
    let mut t = Topology::start("failover-start").await;
    let (mut standby, both) = synchronous_standby(&t, "failover-start-standby").await;
    t.add_tenant("m", "shard_1").await;
    t.seed_orders("shard_1", "m", 10, 1).await;
    crash(&t);
    let crashed = std::time::SystemTime::now();
    let options = MoveOptions {
        method: MethodChoice::Copy,

        ..Default::default()
    };
    let mover = Mover::new(both, Overrides::default(), options);
    let key = EntityKey::new("tenant", "m");
    let (moved, ()) = tokio::join!(mover.start(&key, "shard_2"), async {
        // The outage lasts a second: the mover is refused meanwhile.
        tokio::time::sleep(Duration::from_secs(1)).await;
        standby.promote();
    });
    let record = moved.unwrap_or_else(|e| panic!("the move through the outage: {e}"));
    assert_eq!(record.phase, Phase::Done);
    std::mem::swap(&mut t.directory, &mut standby);
    let started: std::time::SystemTime = t
        .dba()
        .await
        .query_one(
            "SELECT started_at FROM shard_directory.shard_moves WHERE move_id = $1",
            &[&record.move_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        started >= crashed + Duration::from_millis(900),
        "recorded once the standby was promoted"
    );
    assert_eq!(t.placement("m").await, "shard_2");
    assert_eq!(t.rows("shard_2", "m").await, (10, 10));
}
