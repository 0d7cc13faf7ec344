//! The mover under faults: a target that is down when a move must be undone, transactions left
//! open on a shard, a mover that stops (or only stalls) in the freeze, a subscription that
//! stops, a slot that keeps too much WAL, objects of another move under this one's name, and
//! another process changing the move behind a run. Each time the freeze ends without a person,
//! no copy is thrown away for a fence that did not commit, and every row stays where the
//! directory says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_client::{DirectoryConfig, EntityKey, RetryPolicy};
use shard_directory_e2e::observe::{self, act_at};
use shard_directory_e2e::topology::CHECKED_AND_LEFT_OPEN;
use shard_directory_e2e::{column, eventually, Topology};
use shard_directory_mover::{Error, Left, MethodChoice, MoveOptions, Phase, Step};
use tokio::sync::Notify;
use tokio_postgres::error::SqlState;

const DEADLINE: Duration = Duration::from_secs(30);

fn tenant(id: &str) -> EntityKey {
    EntityKey::new("tenant", id)
}

fn logical() -> MoveOptions {
    MoveOptions {
        method: MethodChoice::Logical,
        ..Default::default()
    }
}

/// A retry policy that waits out a freeze and its lease.
fn patient() -> RetryPolicy {
    RetryPolicy::default().deadline(Duration::from_secs(20))
}

async fn phase_of(t: &Topology, move_id: i64) -> (String, Option<i64>) {
    let r = t
        .dba()
        .await
        .query_one(
            "SELECT phase, freeze_version FROM shard_directory.shard_moves WHERE move_id = $1",
            &[&move_id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// A topology with tenant `a` (10 orders of 2 lines) on shard_1.
async fn with_tenant(name: &str) -> Topology {
    let t = Topology::with_shards(name, 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 10, 2).await;
    t
}

#[tokio::test]
async fn an_abort_releases_the_entity_before_it_cleans_the_target_even_with_the_target_down() {
    let t = with_tenant("abort-down").await;
    let id = observe::crash_at(&t, logical(), &tenant("a"), "shard_2", Phase::Verified).await;
    assert_eq!(t.entry("tenant", "a").await.1, "read_only");
    t.shard_cluster("shard_2").stop();
    let failure = t
        .mover(MoveOptions::default())
        .abort(id)
        .await
        .expect_err("the target is down");
    assert_eq!(failure.left, Left::Released, "{failure}");
    assert!(
        failure.to_string().contains("is unreachable")
            && failure
                .to_string()
                .contains(&format!("shard-directory abort {id}")),
        "{failure}"
    );
    // Released all the same: active and writable on its source, its fence as it was.
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
    assert_eq!(t.fence("shard_1", "a").await, None);
    Topology::order(&t.connected_router().await, "a", "while the target is down")
        .await
        .expect("writable on its source");
    assert_eq!(phase_of(&t, id).await.0, "aborting");
    t.shard_cluster("shard_2").restart();
    let record = t.mover(MoveOptions::default()).abort(id).await.unwrap();
    assert_eq!(record.phase, Phase::Aborted);
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
    assert_eq!(t.rows("shard_1", "a").await, (11, 20));
    assert_eq!(t.fence("shard_2", "a").await, None);
    assert!(
        t.replication_objects().await.is_empty(),
        "{:?}",
        t.replication_objects().await
    );
}

/// Logical moves whose fence changes give up after 3 s of waiting.
fn impatient() -> MoveOptions {
    MoveOptions {
        fence_patience: Duration::from_secs(3),
        ..logical()
    }
}

/// Commits the transaction a [`block_fences_at`] left open.
async fn commit(blocker: &tokio::sync::Mutex<Option<tokio_postgres::Client>>) {
    let c = blocker
        .lock()
        .await
        .take()
        .expect("the transaction was opened");
    c.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test]
async fn a_freeze_never_starts_behind_an_open_checked_transaction_and_the_copy_is_kept() {
    let t = with_tenant("fence-wait").await;
    let (blocker, pid) = t.idle_checked_transaction("shard_1").await;
    let options = impatient();
    let failure = t
        .mover(options.clone())
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("the open transaction holds the freeze back");
    assert!(
        matches!(&failure.error, Error::Blocked { blockers, .. } if blockers.contains(&format!("pid {pid}"))),
        "{failure}"
    );
    assert_eq!(failure.left, Left::Resumable, "never aborted: {failure}");
    let id = failure.move_id.unwrap();
    // Nothing was frozen, and the copy is still there, streaming.
    assert_eq!(phase_of(&t, id).await, ("catching_up".into(), None));
    assert_eq!(t.entry("tenant", "a").await.1, "migrating");
    assert_eq!(t.rows("shard_2", "a").await, (10, 20));
    assert!(t
        .replication_objects()
        .await
        .contains(&format!("shard_2: subscription sd_move_{id}")));
    blocker.batch_execute("COMMIT").await.unwrap();
    let record = t.mover(options).resume(id).await.unwrap();
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(t.rows("shard_2", "a").await, (10, 20));
}

/// A busy shard's checked transactions are each idle for a moment between statements, and
/// some one of them nearly always is: short ones never hold the freeze back (the wait before it
/// once took any idle one for a transaction left open, and gave up after `--fence-wait`).
#[tokio::test]
async fn a_freeze_is_not_held_back_by_a_busy_shards_short_transactions() {
    let t = with_tenant("fence-busy").await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut sessions = Vec::new();
    for _ in 0..4 {
        let (c, mut stopped) = (t.shard("shard_1").await, stopped.clone());
        sessions.push(tokio::spawn(async move {
            let mut transactions = 0;
            while !*stopped.borrow() {
                c.batch_execute(CHECKED_AND_LEFT_OPEN).await.unwrap();
                // The application's own work between two statements: idle in the transaction.
                let _ = tokio::time::timeout(Duration::from_millis(30), stopped.changed()).await;
                c.batch_execute("COMMIT").await.unwrap();
                transactions += 1;
            }
            transactions
        }));
    }
    let record = t.mover(impatient()).start(&tenant("a"), "shard_2").await;
    stop.send(true).unwrap();
    let mut transactions = 0;
    for s in sessions {
        transactions += s.await.unwrap();
    }
    let record = record.unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(t.rows("shard_2", "a").await, (10, 20));
    // Busy: each of the 4 sessions ran a few checked transactions while the move ran (a fast
    // move on a quiet machine sees about 40; asking for more than 40 failed now and then).
    assert!(transactions >= 20, "the shard was busy: {transactions}");
}

/// Opens an idle checked transaction on `shard` when the move reaches `at`; hands it over.
fn block_fences_at(
    t: &Topology,
    shard: &str,
    at: Phase,
) -> (
    Arc<shard_directory_e2e::observe::ActAt>,
    Arc<tokio::sync::Mutex<Option<tokio_postgres::Client>>>,
) {
    let blocker = Arc::new(tokio::sync::Mutex::new(None));
    let act = act_at(at, {
        let (config, blocker) = (t.shard_cluster(shard).config("app"), blocker.clone());
        move || {
            let (config, blocker) = (config.clone(), blocker.clone());
            Box::pin(async move {
                let (c, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(connection);
                c.batch_execute(CHECKED_AND_LEFT_OPEN).await.unwrap();
                *blocker.lock().await = Some(c);
            })
        }
    });
    (act, blocker)
}

#[tokio::test]
async fn a_source_fence_that_cannot_commit_undoes_the_freeze_and_keeps_the_copy() {
    let t = with_tenant("thaw").await;
    // The transaction opens after the check before the freeze, so only the fence finds it.
    let (act, blocker) = block_fences_at(&t, "shard_1", Phase::Frozen);
    let options = impatient();
    let failure = t
        .mover(options.clone())
        .with_observer(act)
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("the source's fence cannot commit");
    assert!(failure.to_string().contains("55P03"), "{failure}");
    assert_eq!(failure.left, Left::Resumable, "never aborted: {failure}");
    let id = failure.move_id.unwrap();
    assert_eq!(phase_of(&t, id).await, ("catching_up".into(), None));
    assert_eq!(t.entry("tenant", "a").await.1, "migrating");
    assert_ne!(t.fence("shard_1", "a").await.as_deref(), Some("frozen"));
    assert_eq!(t.rows("shard_2", "a").await, (10, 20), "the copy is kept");
    commit(&blocker).await;
    let record = t.mover(options).resume(id).await.unwrap();
    assert_eq!(record.phase, Phase::Done);
}

#[tokio::test]
async fn a_fence_change_after_the_cutover_is_retried_and_never_offers_an_abort() {
    let t = with_tenant("fence-after").await;
    let (act, blocker) = block_fences_at(&t, "shard_1", Phase::Cutover);
    let options = impatient();
    let failure = t
        .mover(options.clone())
        .with_observer(act)
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("the source's fence cannot commit behind the open transaction");
    assert_eq!(failure.left, Left::Resumable);
    assert_eq!(failure.phase, Some(Phase::Cutover));
    let message = failure.to_string();
    assert!(
        message.contains("past its cutover") && !message.contains("abort"),
        "{message}"
    );
    assert!(failure.error.to_string().contains("55P03"), "{message}");
    commit(&blocker).await;
    let record = t
        .mover(options)
        .resume(failure.move_id.unwrap())
        .await
        .unwrap();
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
}

#[tokio::test]
async fn a_mover_that_stalls_past_its_lease_does_not_cut_over_and_the_writes_since_are_kept() {
    let t = with_tenant("lease").await;
    let options = MoveOptions {
        max_freeze: Duration::from_secs(2),
        lease_grace: Duration::from_secs(1),
        ..logical()
    };
    let resume = Arc::new(Notify::new());
    let act = act_at(Phase::Verified, {
        let resume = resume.clone();
        move || {
            let resume = resume.clone();
            Box::pin(async move { resume.notified().await })
        }
    });
    let mover = t.mover(options).with_observer(act);
    let key = tenant("a");
    let moving = mover.start(&key, "shard_2");
    let meanwhile = async {
        let dba = t.dba().await;
        eventually("the lease to end", DEADLINE, || async {
            let ended: bool = dba
                .query_one(
                    "SELECT coalesce(bool_or(freeze_lease_until < clock_timestamp() AND phase = 'verified'), false) \
                     FROM shard_directory.shard_moves",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            ended.then_some(())
        })
        .await;
        // A router finds the entity read-only past the lease: the directory releases it, and
        // the source's fence, its own lease ended, admits the write.
        let router = t
            .router(t.client_directory(DirectoryConfig::default()).await)
            .with_retry(patient());
        Topology::order(&router, "a", "after the lease")
            .await
            .expect("written once the lease ended");
        assert_eq!(
            t.entry("tenant", "a").await,
            ("shard_1".into(), "active".into())
        );
        resume.notify_one();
    };
    let (failure, ()) = tokio::join!(moving, meanwhile);
    let failure = failure.expect_err("the stalled mover does not cut over");
    assert_eq!(failure.left, Left::Aborted, "{failure}");
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
    assert_eq!(t.orders("shard_1", "a").await.len(), 11);
    assert!(t
        .orders("shard_1", "a")
        .await
        .contains(&"after the lease".to_owned()));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
    assert_eq!(t.fence("shard_1", "a").await, None);
}

#[tokio::test]
async fn a_mover_that_vanished_in_the_freeze_leaves_its_entity_writable_once_the_lease_ends() {
    let t = with_tenant("vanished").await;
    let options = MoveOptions {
        max_freeze: Duration::from_secs(2),
        lease_grace: Duration::from_secs(1),
        ..logical()
    };
    let id = observe::crash_at(&t, options.clone(), &tenant("a"), "shard_2", Phase::Frozen).await;
    let frozen_at = Instant::now();
    let router = t
        .router(t.client_directory(DirectoryConfig::default()).await)
        .with_retry(patient());
    Topology::order(&router, "a", "after the mover vanished")
        .await
        .expect("writable once the lease ends");
    let waited = frozen_at.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "the freeze ended {waited:?} after the mover vanished"
    );
    assert_eq!(phase_of(&t, id).await.0, "aborting");
    // Resumed, the abort the lease began is finished, and reported as what it is: no move.
    let failure = t
        .mover(options)
        .resume(id)
        .await
        .expect_err("an aborted move");
    assert_eq!(
        (failure.left, failure.phase),
        (Left::Aborted, Some(Phase::Aborted)),
        "{failure}"
    );
    assert!(failure.to_string().contains("lease ended"), "{failure}");
    assert_eq!(t.rows("shard_1", "a").await, (11, 20));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
}

#[tokio::test]
async fn busy_names_the_process_that_holds_the_move() {
    let t = with_tenant("busy").await;
    let held = act_at(Phase::CatchingUp, || Box::pin(std::future::pending()));
    let mover = t.mover(logical()).with_observer(held);
    let key = tenant("a");
    let moving = mover.start(&key, "shard_2");
    let other = async {
        eventually("the move to catch up", DEADLINE, || async {
            let open: Option<(String, i64)> = t
                .dba()
                .await
                .query_opt(
                    "SELECT phase, move_id FROM shard_directory.shard_moves WHERE finished_at IS NULL",
                    &[],
                )
                .await
                .unwrap()
                .map(|r| (r.get(0), r.get(1)));
            open.filter(|(p, _)| p == "catching_up").map(|_| ())
        })
        .await;
        let id = observe::open_move(&t, &key).await;
        t.mover(MoveOptions::default())
            .abort(id)
            .await
            .expect_err("the move is held")
    };
    let failure = tokio::select! {
        r = moving => panic!("held at catching_up: {r:?}"),
        f = other => f,
    };
    match &failure.error {
        Error::Busy { holder, .. } => assert!(
            holder.contains("pid ")
                && holder.contains("shard-directory move")
                && holder.contains("since"),
            "{holder}"
        ),
        other => panic!("expected busy, got {other}"),
    }
}

#[tokio::test]
async fn a_subscription_that_stopped_is_turned_on_again_and_a_slot_keeping_too_much_wal_aborts() {
    let t = with_tenant("replication").await;
    let target = Arc::new(t.shard("shard_2").await);
    let act = act_at(Phase::CatchingUp, {
        let target = target.clone();
        move || {
            let target = target.clone();
            Box::pin(async move {
                // As disable_on_error leaves it after a conflict.
                target
                    .batch_execute("ALTER SUBSCRIPTION sd_move_1 DISABLE")
                    .await
                    .unwrap();
            })
        }
    });
    let record = t
        .mover(logical())
        .with_observer(act.clone())
        .start(&tenant("a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    assert!(
        act.notes()
            .iter()
            .any(|n| n.contains("subscription sd_move_1") && n.contains("turning it on again")),
        "{:?}",
        act.notes()
    );
    // Back, with a slot that may keep almost nothing.
    let failure = t
        .mover(MoveOptions {
            max_slot_lag: 1,
            ..logical()
        })
        .start(&tenant("a"), "shard_1")
        .await
        .expect_err("the slot keeps more than a byte");
    assert!(
        matches!(failure.error, Error::SlotLag { .. }) && failure.left == Left::Aborted,
        "{failure}"
    );
    assert!(failure.to_string().contains("max_slot_wal_keep_size"));
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_2".into(), "active".into())
    );
    assert!(
        t.replication_objects().await.is_empty(),
        "{:?}",
        t.replication_objects().await
    );
}

#[tokio::test]
async fn a_slot_that_waits_behind_an_open_transaction_gives_up_naming_it() {
    let t = with_tenant("slot-wait").await;
    let open = t.shard("shard_1").await;
    open.batch_execute("CREATE TABLE scratch (n int); BEGIN; INSERT INTO scratch VALUES (1)")
        .await
        .unwrap();
    let pid = shard_directory_e2e::backend_pid(&open).await;
    let options = MoveOptions {
        fence_patience: Duration::from_secs(2),
        ..logical()
    };
    let failure = t
        .mover(options.clone())
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("the slot waits for the open transaction");
    assert!(
        matches!(&failure.error, Error::Blocked { what, blockers, .. }
            if what.contains("replication slot") && blockers.contains(&format!("pid {pid}"))),
        "{failure}"
    );
    assert_eq!(failure.left, Left::Resumable);
    let slots: i64 = t
        .shard("shard_1")
        .await
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "nothing left behind");
    open.batch_execute("COMMIT").await.unwrap();
    let record = t
        .mover(options)
        .resume(failure.move_id.unwrap())
        .await
        .unwrap();
    assert_eq!(record.phase, Phase::Done);
}

#[tokio::test]
async fn replication_objects_of_another_move_are_never_adopted() {
    let t = with_tenant("adopt").await;
    let source = t.shard("shard_1").await;
    source
        .batch_execute("CREATE PUBLICATION sd_move_1 FOR TABLE orders")
        .await
        .unwrap();
    let failure = t
        .mover(logical())
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("the publication is not this move's");
    assert!(
        failure
            .to_string()
            .contains("publication sd_move_1 exists but is not this move's"),
        "{failure}"
    );
    assert_eq!(failure.left, Left::Resumable);
    let tables: i64 = source
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'sd_move_1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 1, "left as it was");
    source
        .batch_execute("DROP PUBLICATION sd_move_1")
        .await
        .unwrap();
    let record = t.mover(logical()).resume(1).await.unwrap();
    assert_eq!(record.phase, Phase::Done);
}

#[tokio::test]
async fn the_target_refuses_the_entitys_writes_for_the_whole_move() {
    let t = with_tenant("target-fence").await;
    let id = observe::crash_at(&t, logical(), &tenant("a"), "shard_2", Phase::CatchingUp).await;
    assert_eq!(t.fence("shard_2", "a").await.as_deref(), Some("frozen"));
    let e = t
        .write_as_client(
            "shard_2",
            "INSERT INTO orders (tenant_id, item, order_id) VALUES ('a', 'misrouted', 999999)",
        )
        .await
        .expect_err("the target is fenced");
    assert_eq!(e.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE));
    let record = t.mover(MoveOptions::default()).abort(id).await.unwrap();
    assert_eq!(record.phase, Phase::Aborted);
    assert_eq!(t.fence("shard_2", "a").await, None, "as it was");
}

#[tokio::test]
async fn a_phase_another_process_moved_on_is_never_overwritten() {
    let t = with_tenant("cas").await;
    let go = Arc::new(Notify::new());
    let act = act_at(Phase::CatchingUp, {
        let go = go.clone();
        move || {
            let go = go.clone();
            Box::pin(async move { go.notified().await })
        }
    });
    let mover = t.mover(logical()).with_observer(act);
    let key = tenant("a");
    let moving = mover.start(&key, "shard_2");
    let behind_its_back = async {
        eventually("the move to catch up", DEADLINE, || async {
            let phase: Option<String> = t
                .dba()
                .await
                .query_opt("SELECT phase FROM shard_directory.shard_moves", &[])
                .await
                .unwrap()
                .map(|r| r.get(0));
            (phase.as_deref() == Some("catching_up")).then_some(())
        })
        .await;
        t.dba()
            .await
            .batch_execute(
                "UPDATE shard_directory.shard_moves SET phase = 'aborting' WHERE move_id = 1",
            )
            .await
            .unwrap();
        go.notify_one();
    };
    let (failure, ()) = tokio::join!(moving, behind_its_back);
    let failure = failure.expect_err("the run finds its phase moved on");
    assert!(
        failure.to_string().contains("another process moved it on"),
        "{failure}"
    );
    assert_eq!(
        failure.left,
        Left::Aborted,
        "the record said aborting: {failure}"
    );
    assert_eq!(
        phase_of(&t, 1).await,
        ("aborted".into(), None),
        "never frozen"
    );
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
}

#[tokio::test]
async fn cleanup_drops_tablesync_slots_whose_subscription_is_gone_and_no_other() {
    let t = with_tenant("tablesync").await;
    let id = observe::crash_at(&t, logical(), &tenant("a"), "shard_2", Phase::CatchingUp).await;
    let (target, source) = (t.shard("shard_2").await, t.shard("shard_1").await);
    let sysid: String = target
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let live: i64 = target
        .query_one(
            "SELECT oid::int8 FROM pg_subscription WHERE subname = $1",
            &[&format!("sd_move_{id}")],
        )
        .await
        .unwrap()
        .get(0);
    let (orphan, kept) = (
        format!("pg_424242_sync_16384_{sysid}"),
        format!("pg_{live}_sync_16384_{sysid}"),
    );
    for slot in [&orphan, &kept] {
        source
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[slot],
            )
            .await
            .unwrap();
    }
    let dropped = t.mover(MoveOptions::default()).cleanup().await.unwrap();
    assert_eq!(
        dropped,
        [format!(
            "slot {orphan} on shard_1 (its subscription on shard_2 is gone)"
        )]
    );
    let slots: Vec<String> = column(
        &source,
        "SELECT slot_name::text FROM pg_replication_slots ORDER BY 1",
        &[],
    )
    .await;
    assert!(
        slots.contains(&kept) && slots.contains(&format!("sd_move_{id}")),
        "{slots:?}"
    );
}

/// A subscription the target's server refuses to create (here its conninfo names an option
/// libpq does not know) is reported on the target, the shard that refused it, not on the
/// source; the move stops resumable and an abort leaves nothing behind.
#[tokio::test]
async fn a_subscription_the_target_refuses_is_reported_on_the_target() {
    let t = Topology::start("faults-subscriber").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 5, 1).await;
    let mut overrides = shard_directory_mover::Overrides::default();
    overrides.shards.insert(
        "shard_1".into(),
        shard_directory_mover::ShardOverride {
            conninfo: None,
            replication_conninfo: Some(format!(
                "{} password=unused no_such_option=1",
                t.shard_cluster("shard_1").conn_str("app")
            )),
        },
    );
    let failure = shard_directory_mover::Mover::new(t.directory_config(), overrides, logical())
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("the target refuses the subscription");
    let message = failure.to_string();
    assert!(
        matches!(&failure.error, Error::Db { place, .. } if place.to_string() == "shard shard_2"),
        "{message}"
    );
    assert!(message.contains("no_such_option"), "{message}");
    assert_eq!(failure.left, Left::Resumable, "{message}");
    let id = failure.move_id.expect("the move was recorded");
    let aborted = t
        .mover(logical())
        .abort(id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(aborted.phase, Phase::Aborted);
    assert_eq!(t.placement("a").await, "shard_1");
    assert_eq!(t.rows("shard_1", "a").await, (5, 5));
    assert!(
        t.replication_objects().await.is_empty(),
        "{:?}",
        t.replication_objects().await
    );
}

/// PostgreSQL drops a table's tablesync slot on the source before it records the table as synced
/// on the target; a target that stops in between comes back with the table copied (`f`) and its
/// slot gone, and retries the catch-up forever. The mover sees the slot lost, copies every table
/// again, and the move ends with the writes made meanwhile.
#[tokio::test]
async fn a_copy_whose_tablesync_slot_was_lost_is_made_again() {
    let t = with_tenant("tablesync-lost").await;
    let (hold, reached) = observe::hold_at(Step::Sync);
    let mover = t.mover(logical()).with_observer(hold);
    observe::until_held(&reached, "the move at its initial copy", async {
        mover.start(&tenant("a"), "shard_2").await
    })
    .await;
    let id = observe::open_move(&t, &tenant("a")).await;
    let name = format!("sd_move_{id}");
    let target = t.shard("shard_2").await;
    let states = "SELECT count(*) FILTER (WHERE r.srsubstate = 'r'), count(*)
                  FROM pg_subscription s JOIN pg_subscription_rel r ON r.srsubid = s.oid
                  WHERE s.subname = $1";
    eventually("every table synced", DEADLINE, || async {
        let r = target.query_one(states, &[&name]).await.unwrap();
        (r.get::<_, i64>(0) == 2 && r.get::<_, i64>(1) == 2).then_some(())
    })
    .await;
    let write = |item: &'static str| {
        let t = &t;
        async move {
            t.write_as_client(
                "shard_1",
                &format!("INSERT INTO orders (tenant_id, item) VALUES ('a', '{item}')"),
            )
            .await
            .unwrap()
        }
    };
    write("before the loss").await;
    // As PostgreSQL leaves a table whose tablesync worker dropped its slot and then stopped: the
    // copy recorded (`f`), no slot on the source (nor here the origin of a table since synced).
    target
        .batch_execute(&format!("ALTER SUBSCRIPTION {name} DISABLE"))
        .await
        .unwrap();
    eventually("the subscription's workers to stop", DEADLINE, || async {
        let r = target
            .query_one(
                "SELECT count(*) FROM pg_stat_subscription WHERE subname = $1 AND pid IS NOT NULL",
                &[&name],
            )
            .await
            .unwrap();
        (r.get::<_, i64>(0) == 0).then_some(())
    })
    .await;
    target
        .execute(
            "UPDATE pg_subscription_rel SET srsubstate = 'f', srsublsn = NULL
             WHERE srsubid = (SELECT oid FROM pg_subscription WHERE subname = $1)
               AND srrelid = 'orders'::regclass",
            &[&name],
        )
        .await
        .unwrap();
    target
        .batch_execute(&format!("ALTER SUBSCRIPTION {name} ENABLE"))
        .await
        .unwrap();
    write("while lost").await;
    eventually(
        "PostgreSQL failing to finish the copy",
        DEADLINE,
        || async {
            let r = target
                .query_one(
                    "SELECT st.sync_error_count FROM pg_stat_subscription_stats st
                 JOIN pg_subscription s ON s.oid = st.subid WHERE s.subname = $1",
                    &[&name],
                )
                .await
                .unwrap();
            (r.get::<_, i64>(0) > 0).then_some(())
        },
    )
    .await;
    let notes = act_at(Phase::Aborted, || Box::pin(std::future::ready(())));
    let record = t
        .mover(MoveOptions {
            sync_timeout: Duration::from_secs(60),
            ..logical()
        })
        .with_observer(notes.clone())
        .resume(id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    assert!(
        notes.notes().iter().any(|n| n.contains(
            "the initial copy of public.orders on shard shard_2 lost its tablesync slot on shard \
             shard_1"
        ) && n.contains("copying every table again")),
        "{:?}",
        notes.notes()
    );
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_2".into(), "active".into())
    );
    let rows = |shard: &'static str| {
        let t = &t;
        async move {
            let c = t.shard(shard).await;
            let r = c
                .query_one(
                    "SELECT (SELECT array_agg(item ORDER BY item COLLATE \"C\") FROM orders WHERE tenant_id = 'a'),
                            (SELECT count(*) FROM order_lines WHERE tenant_id = 'a')",
                    &[],
                )
                .await
                .unwrap();
            (r.get::<_, Option<Vec<String>>>(0), r.get::<_, i64>(1))
        }
    };
    let mut expected: Vec<String> = (1..=10).map(|n| format!("seed a {n}")).collect();
    expected.extend(["before the loss".into(), "while lost".into()]);
    expected.sort();
    assert_eq!(rows("shard_2").await, (Some(expected), 20));
    assert_eq!(rows("shard_1").await, (None, 0));
    assert!(
        t.replication_objects().await.is_empty(),
        "{:?}",
        t.replication_objects().await
    );
}
