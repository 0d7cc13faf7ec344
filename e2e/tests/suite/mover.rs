//! The mover against real clusters: both methods carry every row while the application writes,
//! preflight refuses what cannot work and changes nothing, verification and the freeze bound
//! abort a move, a move stopped at any phase resumes or aborts cleanly, and `cleanup` removes
//! what finished moves left behind.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use shard_directory_client::{EntityKey, Router, State};
use shard_directory_e2e::observe::{self, act_at, ActAt, At};
use shard_directory_e2e::{eventually, Topology};
use shard_directory_mover::{
    Error, Fence, Left, Method, MethodChoice, MoveOptions, MoveRecord, Phase, Step,
};
use tokio::sync::watch;
use tokio_postgres::Client;

fn tenant(id: &str) -> EntityKey {
    EntityKey::new("tenant", id)
}

const DEADLINE: Duration = Duration::from_secs(30);

fn options(method: MethodChoice) -> MoveOptions {
    MoveOptions {
        method,
        ..Default::default()
    }
}

/// Writes `orders` orders of two lines each for `id` on `shard`.
async fn seed(t: &Topology, shard: &str, id: &str, orders: i64) {
    t.seed_orders(shard, id, orders, 2).await;
}

async fn fence_of(t: &Topology, shard: &str, id: &str) -> Option<String> {
    t.fence(shard, id).await
}

/// `(shard_name, state)` of the tenant's entry.
async fn entry(t: &Topology, id: &str) -> (String, String) {
    t.entry("tenant", id).await
}

async fn replication_objects(t: &Topology) -> Vec<String> {
    t.replication_objects().await
}

async fn order(router: &Router, id: &str, item: &str) -> Result<(), shard_directory_client::Error> {
    Topology::order(router, id, item).await
}

async fn router(t: &Topology) -> Router {
    t.connected_router().await
}

async fn assert_moved(t: &Topology, record: &MoveRecord, id: &str, expected: (i64, i64)) {
    let (from, to) = (&record.source_shard, &record.target_shard);
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(entry(t, id).await, (to.clone(), "active".to_owned()));
    assert_eq!(t.rows(to, id).await, expected, "every row on the target");
    assert_eq!(t.rows(from, id).await, (0, 0), "none left on the source");
    assert_eq!(
        fence_of(t, from, id).await.as_deref(),
        Some(&*format!("moved:{to}"))
    );
    assert_eq!(fence_of(t, to, id).await.as_deref(), Some("owned"));
    assert!(
        replication_objects(t).await.is_empty(),
        "{:?}",
        replication_objects(t).await
    );
    assert!(
        record.freeze_time().is_some(),
        "the freeze time is reported"
    );
}

async fn move_under_load(method: MethodChoice, expected: Method) {
    let t = Topology::with_shards(&format!("move-{expected:?}"), 2).await;
    t.add_tenant("a", "shard_1").await;
    t.add_tenant("b", "shard_1").await;
    seed(&t, "shard_1", "a", 500).await;
    seed(&t, "shard_1", "b", 10).await;
    let (stop, stopped) = watch::channel(false);
    let writer = {
        let t = &t;
        async move { t.keep_ordering("a", stopped).await }
    };
    let mover = async {
        let record = t
            .mover(options(method))
            .start(&tenant("a"), "shard_2")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        stop.send(true).unwrap();
        record
    };
    let (record, acked) = tokio::join!(mover, writer);
    assert_eq!(record.method, expected);
    assert!(acked > 0, "the application kept writing");
    assert_moved(&t, &record, "a", (500 + acked, 1000)).await;
    assert_eq!(t.rows("shard_1", "b").await, (10, 20), "other tenants stay");
    // Verified under the freeze: the seed and the writes acked before it (later ones went to
    // the target).
    let verified = record.tables["public.orders"].verified.expect("verified");
    assert!(
        (500..=500 + acked).contains(&verified),
        "{verified} of {acked}"
    );
    // The target's sequence was advanced past the copied keys: new orders do not collide.
    let router = router(&t).await;
    for _ in 0..3 {
        order(&router, "a", "after")
            .await
            .expect("a new order on the target");
    }
    assert_eq!(t.rows("shard_2", "a").await.0, 503 + acked);
}

#[tokio::test]
async fn a_logical_move_carries_every_row_while_the_application_writes() {
    move_under_load(MethodChoice::Auto, Method::Logical).await;
}

#[tokio::test]
async fn a_copy_move_carries_every_row_while_the_application_writes() {
    move_under_load(MethodChoice::Copy, Method::Copy).await;
}

/// Starts a move of tenant `id` to `to` and stops it dead once its record says `at`.
async fn crash_at(t: &Topology, method: MethodChoice, id: &str, to: &str, at: Phase) -> i64 {
    observe::crash_at(t, options(method), &tenant(id), to, at).await
}

async fn assert_aborted(t: &Topology, record: &MoveRecord, id: &str, seeded: (i64, i64)) {
    assert_eq!(record.phase, Phase::Aborted);
    assert_eq!(
        entry(t, id).await,
        (record.source_shard.clone(), "active".into())
    );
    assert_eq!(
        t.rows(&record.source_shard, id).await,
        seeded,
        "all rows at the source"
    );
    assert_eq!(
        t.rows(&record.target_shard, id).await,
        (0, 0),
        "none left on the target"
    );
    assert!(
        replication_objects(t).await.is_empty(),
        "{:?}",
        replication_objects(t).await
    );
}

async fn stopped_moves_resume_or_abort_from_every_phase(by: Method) {
    let method = match by {
        Method::Logical => MethodChoice::Logical,
        Method::Copy => MethodChoice::Copy,
    };
    let t = Topology::with_shards(&format!("crash-{}", by.as_str()), 2).await;
    let mover = t.mover(options(method));
    let phases = &by.phases()[..by.phases().len() - 1]; // all but done
    for (i, &phase) in phases.iter().enumerate() {
        let (resumed, aborted) = (format!("r{i}"), format!("a{i}"));
        for id in [&resumed, &aborted] {
            t.add_tenant(id, "shard_1").await;
            seed(&t, "shard_1", id, 20).await;
        }
        let move_id = crash_at(&t, method, &resumed, "shard_2", phase).await;
        let record = mover
            .resume(move_id)
            .await
            .unwrap_or_else(|e| panic!("resume from {phase}: {e}"));
        assert_moved(&t, &record, &resumed, (20, 40)).await;

        let move_id = crash_at(&t, method, &aborted, "shard_2", phase).await;
        if phase.can_abort() {
            let record = mover
                .abort(move_id)
                .await
                .unwrap_or_else(|e| panic!("abort from {phase}: {e}"));
            assert_aborted(&t, &record, &aborted, (20, 40)).await;
            assert_eq!(
                fence_of(&t, "shard_1", &aborted).await,
                None,
                "fences as they were"
            );
            assert_eq!(fence_of(&t, "shard_2", &aborted).await, None);
            // Writable on its source again.
            order(&router(&t).await, &aborted, "x")
                .await
                .expect("writable after the abort");
        } else {
            let refused = mover.abort(move_id).await.expect_err("only forward");
            assert!(
                matches!(refused.error, Error::State { .. }) && refused.left == Left::Resumable,
                "{refused}"
            );
            assert!(refused.to_string().contains("only forward"), "{refused}");
            let record = mover
                .resume(move_id)
                .await
                .expect("resume after the refusal");
            assert_moved(&t, &record, &aborted, (20, 40)).await;
        }
    }
}

#[tokio::test]
async fn a_logical_move_stopped_at_any_phase_resumes_or_aborts() {
    stopped_moves_resume_or_abort_from_every_phase(Method::Logical).await;
}

#[tokio::test]
async fn a_copy_move_stopped_at_any_phase_resumes_or_aborts() {
    stopped_moves_resume_or_abort_from_every_phase(Method::Copy).await;
}

#[tokio::test]
async fn an_abort_puts_back_the_fences_an_earlier_move_left() {
    let t = Topology::with_shards("refence", 2).await;
    t.add_tenant("r", "shard_1").await;
    seed(&t, "shard_1", "r", 5).await;
    let there = t.move_tenant("r", "shard_2").await;
    let move_id = crash_at(&t, MethodChoice::Logical, "r", "shard_1", Phase::Verified).await;
    assert_eq!(
        fence_of(&t, "shard_1", "r").await.as_deref(),
        Some("owned"),
        "fenced for the cutover"
    );
    let record = t
        .mover(MoveOptions::default())
        .abort(move_id)
        .await
        .unwrap();
    assert_aborted(&t, &record, "r", (5, 10)).await;
    assert_eq!(
        fence_of(&t, "shard_1", "r").await.as_deref(),
        Some("moved:shard_2")
    );
    assert_eq!(fence_of(&t, "shard_2", "r").await.as_deref(), Some("owned"));
    assert_eq!(
        record.source_fence,
        Fence::Owned {
            min_version: there - 1
        }
    );
}

/// One row of a query's first column, as i64, on `c`.
async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn the_freeze_waits_until_the_target_applied_every_write_committed_before_the_fence() {
    let t = Topology::with_shards("catchup", 2).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 10).await;
    let version = t.step("SELECT shard_directory.current_version()").await;
    let (writer, locker) = (
        Arc::new(t.shard("shard_1").await),
        Arc::new(t.shard("shard_2").await),
    );
    // Right before the freeze: a lock on the target that its apply will stall on, and a checked
    // write of the tenant in flight on the source when the freeze begins (the fence waits for
    // it; it commits a second later, on its own).
    let act = act_at(Step::Freeze, {
        let (writer, locker) = (writer.clone(), locker.clone());
        move || {
            let (writer, locker) = (writer.clone(), locker.clone());
            Box::pin(async move {
                locker
                    .batch_execute("BEGIN; LOCK TABLE orders IN SHARE MODE")
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    writer
                        .batch_execute(&format!(
                            "BEGIN; SELECT set_config('app.directory_version', '{version}', true);
                             INSERT INTO orders (tenant_id, item) VALUES ('a', 'late');
                             SELECT pg_sleep(1); COMMIT"
                        ))
                        .await
                        .unwrap();
                });
            })
        }
    });
    let mover = t.mover(options(MethodChoice::Logical)).with_observer(act);
    let key = tenant("a");
    let moving = mover.start(&key, "shard_2");
    let (source, target, dba) = (
        t.shard("shard_1").await,
        t.shard("shard_2").await,
        t.dba().await,
    );
    let held = async {
        eventually("the fence to wait for the open write", DEADLINE, || async {
            let waiting = count(
                &source,
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name LIKE 'shard-directory move %' AND wait_event_type = 'Lock'",
            );
            (waiting.await == 1).then_some(())
        })
        .await;
        eventually("the mover to wait for the catch-up", DEADLINE, || async {
            let waiting = count(
                &dba,
                "SELECT count(*) FROM shard_directory.shard_moves \
                 WHERE phase = 'frozen' AND catchup_lsn IS NOT NULL AND confirmed_lsn IS NULL",
            );
            (waiting.await == 1).then_some(())
        })
        .await;
        eventually(
            "the target's apply to stall on the lock",
            DEADLINE,
            || async {
                let stalled = count(
                    &target,
                    "SELECT count(*) FROM pg_stat_activity \
                 WHERE backend_type = 'logical replication worker' AND wait_event_type = 'Lock'",
                );
                (stalled.await == 1).then_some(())
            },
        )
        .await;
        // Held on purpose: while the target has not applied the late write, nothing moves on.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(entry(&t, "a").await, ("shard_1".into(), "read_only".into()));
        locker.batch_execute("ROLLBACK").await.unwrap();
    };
    let (record, ()) = tokio::join!(moving, held);
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    assert_moved(&t, &record, "a", (11, 20)).await;
    assert!(record.catchup_lsn.is_some() && record.confirmed_lsn.is_some());
}

/// A row planted on the target: where in the move, the statement, the rows compared on each side
/// by the check that finds it, the key it names, with the online check or without.
struct Plant {
    at: At,
    sql: &'static str,
    rows: (i64, i64),
    named: &'static str,
    online_check: bool,
}

/// A row lost, altered or added on the target behind the mover's back (and its fence's: by a
/// superuser, with triggers off) aborts the move, naming the key: lost during the copy (the online
/// check finds it), altered after the online check, added under the freeze (change tracking
/// carries both to the check under the freeze, which compares only what changed).
#[tokio::test]
async fn a_row_lost_altered_or_added_on_the_target_aborts_and_is_named() {
    let t = Topology::with_shards("mismatch", 2).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 50).await;
    let cases: [Plant; 4] = [
        Plant {
            at: Phase::CatchingUp.into(),
            sql: "DELETE FROM orders WHERE tenant_id = 'a' AND order_id = 5",
            rows: (1, 0),
            named: "(a,5)",
            online_check: true,
        },
        Plant {
            at: Step::Freeze.into(),
            sql: "UPDATE orders SET item = 'altered' WHERE tenant_id = 'a' AND order_id = 7",
            rows: (1, 1),
            named: "(a,7)",
            online_check: true,
        },
        Plant {
            at: Phase::Frozen.into(),
            sql: "INSERT INTO orders (tenant_id, item, order_id) VALUES ('a', 'rogue', 999999)",
            rows: (0, 1),
            named: "(a,999999)",
            online_check: true,
        },
        // without the online check, every row is compared under the freeze
        Plant {
            at: Phase::Frozen.into(),
            sql: "INSERT INTO orders (tenant_id, item, order_id) VALUES ('a', 'rogue', 999998)",
            rows: (50, 51),
            named: "(a,999998)",
            online_check: false,
        },
    ];
    for Plant {
        at,
        sql: planted,
        rows,
        named,
        online_check,
    } in cases
    {
        let target = Arc::new(t.shard("shard_2").await);
        let act = act_at(at, move || {
            let target = target.clone();
            let sql =
                format!("BEGIN; SET LOCAL session_replication_role = replica; {planted}; COMMIT");
            Box::pin(async move {
                target
                    .batch_execute(&sql)
                    .await
                    .expect("planted on the target");
            })
        });
        let failure = t
            .mover(MoveOptions {
                online_check,
                ..options(MethodChoice::Logical)
            })
            .with_observer(act.clone())
            .start(&tenant("a"), "shard_2")
            .await
            .expect_err(&format!(
                "the check under the freeze fails: {:?}",
                act.notes()
            ));
        match &failure.error {
            Error::Mismatch {
                table,
                source_rows,
                target_rows,
                changed_only,
                keys,
            } => {
                assert_eq!(table, "public.orders", "{planted}");
                assert_eq!((*source_rows, *target_rows), rows, "{planted}");
                assert_eq!(*changed_only, online_check, "{planted}: {:?}", act.notes());
                assert_eq!(keys, &[named], "{planted}");
            }
            other => panic!("{planted}: expected a mismatch, got {other}"),
        }
        assert_eq!(failure.left, Left::Aborted, "{failure}");
        let record = t
            .mover(MoveOptions::default())
            .status(failure.move_id.unwrap())
            .await
            .unwrap();
        assert_aborted(&t, &record, "a", (50, 100)).await;
        assert!(record.last_error.unwrap().contains(named));
    }
}

#[tokio::test]
async fn a_freeze_longer_than_max_freeze_aborts_and_the_tenant_is_writable_again() {
    let t = Topology::with_shards("maxfreeze", 2).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 10).await;
    // The catch-up is held up past the bound (here by the observer; in life by a slow target).
    let act = act_at(Phase::Frozen, || {
        Box::pin(tokio::time::sleep(Duration::from_millis(1500)))
    });
    let max_freeze = Duration::from_secs(1);
    let failure = t
        .mover(MoveOptions {
            max_freeze,
            ..options(MethodChoice::Logical)
        })
        .with_observer(act.clone())
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("every freeze runs out");
    assert!(
        matches!(failure.error, Error::FreezeExceeded { limit, .. } if limit == max_freeze),
        "{failure}"
    );
    assert_eq!(failure.left, Left::Aborted, "{failure}");
    let notes = act.notes();
    assert!(
        ["freeze 2 of 3", "freeze 3 of 3"]
            .iter()
            .all(|n| notes.iter().any(|note| note.contains(n))),
        "each freeze but the last undone and tried again: {notes:?}"
    );
    let record = t
        .mover(MoveOptions::default())
        .status(failure.move_id.unwrap())
        .await
        .unwrap();
    assert_aborted(&t, &record, "a", (10, 20)).await;
    assert!(
        record.freeze_time().unwrap() >= max_freeze,
        "{:?}",
        record.freeze_time()
    );
    let router = router(&t).await;
    let entry = router.directory().lookup("tenant", "a").await.unwrap();
    assert_eq!(entry.state, State::Active);
    order(&router, "a", "after")
        .await
        .expect("writable on its source");
    assert_eq!(t.rows("shard_1", "a").await.0, 11);
}

/// Moves tenant `a` (10 orders of 2 lines) to shard_2 by logical with `max_freeze`, observed by
/// `act`, and checks that every row moved.
async fn move_seeded_a(t: &Topology, max_freeze: Duration, act: Arc<ActAt>) -> MoveRecord {
    let record = t
        .mover(MoveOptions {
            max_freeze,
            ..options(MethodChoice::Logical)
        })
        .with_observer(act)
        .start(&tenant("a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_moved(t, &record, "a", (10, 20)).await;
    record
}

/// Each phase a move's record enters is notified on `shard_directory_moves` as it commits, in
/// order, so a tool can follow moves without polling.
#[tokio::test]
async fn each_phase_of_a_move_is_notified_as_it_commits() {
    let t = Topology::with_shards("movenotify", 2).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 3).await;
    let mut listener = t.directory.connect_listening("directory").await;
    listener
        .client
        .batch_execute("LISTEN shard_directory_moves")
        .await
        .unwrap();
    let record = t
        .mover(options(MethodChoice::Logical))
        .start(&tenant("a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut phases = Vec::new();
    while phases.last().map(String::as_str) != Some("done") {
        let n = tokio::time::timeout(DEADLINE, listener.notifications.recv())
            .await
            .expect("a notification per phase")
            .unwrap();
        let payload: serde_json::Value = serde_json::from_str(n.payload()).unwrap();
        assert_eq!(
            (
                payload["move_id"].as_i64(),
                payload["entity_type"].as_str(),
                payload["entity_id"].as_str(),
                payload["source_shard"].as_str(),
                payload["target_shard"].as_str(),
            ),
            (
                Some(record.move_id),
                Some("tenant"),
                Some("a"),
                Some("shard_1"),
                Some("shard_2")
            )
        );
        phases.push(payload["phase"].as_str().unwrap().to_owned());
    }
    let expected: Vec<&str> = Method::Logical
        .phases()
        .iter()
        .map(|p| p.as_str())
        .collect();
    assert_eq!(phases, expected);
}

/// The time from the move entering `cleaning_up` (the source's delete) to its end.
async fn cleaning_up_time(
    t: &Topology,
    options: MoveOptions,
    from: &str,
    to: &str,
    act: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static,
) -> Duration {
    let began = Arc::new(Mutex::new(None));
    let observer = act_at(Phase::CleaningUp, {
        let began = began.clone();
        move || {
            *began.lock().unwrap() = Some(Instant::now());
            act()
        }
    });
    let record = t
        .mover(options)
        .with_observer(observer)
        .start(&tenant("a"), to)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (record.source_shard.as_str(), record.phase),
        (from, Phase::Done)
    );
    assert_eq!(t.rows(from, "a").await, (0, 0));
    let began = began.lock().unwrap().expect("cleaned up");
    began.elapsed()
}

/// The source's delete keeps to `--max-rate` rows a second, and waits while the source's standby
/// is more than `--max-lag` behind in replay.
#[tokio::test]
async fn the_source_delete_keeps_to_max_rate_and_waits_for_a_lagging_standby() {
    let t = Topology::with_shards("throttle", 2).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 10).await;
    // 30 rows in batches of 5 at 20 rows a second: the last batch is due 1.5 s after the first
    let paced = MoveOptions {
        delete_batch: 5,
        max_rate: Some(20),
        ..options(MethodChoice::Logical)
    };
    let took = cleaning_up_time(&t, paced, "shard_1", "shard_2", || Box::pin(async {})).await;
    assert!(took >= Duration::from_millis(1400), "{took:?}");

    // Back, from shard_2, whose standby stops replaying when the delete begins (2 MB behind,
    // over --max-lag 1 MB) and goes on a second later.
    let standby = t.shard_cluster("shard_2").standby("throttle-standby");
    let replica = Arc::new(standby.connect("app").await);
    let resumed = Arc::new(Mutex::new(None));
    let writer = Arc::new(t.shard("shard_2").await);
    let lagging = MoveOptions {
        max_lag: Some(1 << 20),
        ..options(MethodChoice::Logical)
    };
    let took = cleaning_up_time(&t, lagging, "shard_2", "shard_1", {
        let (replica, resumed, writer) = (replica.clone(), resumed.clone(), writer.clone());
        move || {
            let (replica, resumed, writer) = (replica.clone(), resumed.clone(), writer.clone());
            Box::pin(async move {
                shard_directory_e2e::lag_for_a_second(replica, &writer, resumed).await;
            })
        }
    })
    .await;
    let resumed = resumed.lock().unwrap().expect("replay resumed");
    assert!(
        took >= Duration::from_secs(1) && resumed.elapsed() < took,
        "{took:?}"
    );
}

/// A freeze that runs out is undone with the copy kept (the same subscription goes on), the
/// tenant writable meanwhile, and the next freeze completes the move.
#[tokio::test]
async fn a_freeze_that_runs_out_is_undone_and_tried_again_with_the_copy_kept() {
    let t = Topology::with_shards("refreeze", 2).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 10).await;
    let target = Arc::new(t.shard("shard_2").await);
    let subscriptions = Arc::new(Mutex::new(Vec::new()));
    let act = act_at(Phase::Frozen, {
        let subscriptions = subscriptions.clone();
        move || {
            let (target, subscriptions) = (target.clone(), subscriptions.clone());
            Box::pin(async move {
                let oid: u32 = target
                    .query_one("SELECT oid FROM pg_subscription", &[])
                    .await
                    .unwrap()
                    .get(0);
                let first = {
                    let mut seen = subscriptions.lock().unwrap();
                    seen.push(oid);
                    seen.len() == 1
                };
                if first {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
            })
        }
    });
    move_seeded_a(&t, Duration::from_secs(1), act.clone()).await;
    let seen = subscriptions.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "two freezes");
    assert_eq!(seen[0], seen[1], "one subscription: the copy kept");
    assert!(
        act.notes()
            .iter()
            .any(|n| n.contains("the freeze was undone, the copy kept")),
        "{:?}",
        act.notes()
    );
}

/// A freeze estimated over half of `--max-freeze` is not started: here the comparison of a
/// changed row before it waits behind a lock on the source; the move catches up and estimates
/// again, never frozen meanwhile, and freezes once the estimate fits.
#[tokio::test]
async fn a_freeze_estimated_over_budget_is_not_started() {
    let t = Topology::with_shards("estimate", 2).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 10).await;
    let (locker, dba) = (Arc::new(t.shard("shard_1").await), Arc::new(t.dba().await));
    let rounds = Arc::new(Mutex::new(Vec::new()));
    let act = act_at(Step::CatchUp, {
        let rounds = rounds.clone();
        move || {
            let (locker, dba, rounds) = (locker.clone(), dba.clone(), rounds.clone());
            Box::pin(async move {
                if !rounds.lock().unwrap().is_empty() {
                    return;
                }
                // a changed row to compare, then the lock its comparison waits behind
                locker
                    .batch_execute(
                        "BEGIN; SET LOCAL session_replication_role = replica;
                         UPDATE orders SET item = 'changed' WHERE tenant_id = 'a' AND order_id = 1;
                         COMMIT",
                    )
                    .await
                    .unwrap();
                locker
                    .batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    let phase: String = dba
                        .query_one("SELECT phase FROM shard_directory.shard_moves", &[])
                        .await
                        .unwrap()
                        .get(0);
                    rounds.lock().unwrap().push(phase);
                    locker.batch_execute("COMMIT").await.unwrap();
                });
            })
        }
    });
    let record = move_seeded_a(&t, Duration::from_secs(2), act.clone()).await;
    assert_eq!(
        rounds.lock().unwrap().as_slice(),
        ["catching_up"],
        "not frozen while the estimate was over"
    );
    let notes = act.notes();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("over half of --max-freeze, catching up again")),
        "{notes:?}"
    );
    assert!(record.freeze_time().unwrap() < Duration::from_secs(1));
}

/// Starts a move of tenant `a` (on shard_1) that preflight must refuse; checks that the message
/// says each of `says` and that nothing changed.
async fn refused(t: &Topology, method: MethodChoice, to: &str, says: &[&str]) {
    let failure = t
        .mover(options(method))
        .start(&tenant("a"), to)
        .await
        .expect_err("preflight refuses");
    assert!(
        matches!(failure.error, Error::Preflight { .. }),
        "{failure}"
    );
    assert_eq!(failure.left, Left::Untouched);
    let message = failure.to_string();
    for part in says {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    let moves: i64 = t
        .step("SELECT count(*) FROM shard_directory.shard_moves")
        .await;
    assert_eq!(moves, 0, "no move recorded");
    assert_eq!(entry(t, "a").await, ("shard_1".into(), "active".into()));
    assert_eq!(fence_of(t, "shard_1", "a").await, None);
}

#[tokio::test]
async fn preflight_refuses_what_cannot_work_names_the_table_and_the_fix_and_changes_nothing() {
    let t = Topology::with_shards("preflight", 3).await;
    t.add_tenant("a", "shard_1").await;
    seed(&t, "shard_1", "a", 3).await;
    let dba = t.dba().await;
    let (s2, s3) = (t.shard("shard_2").await, t.shard("shard_3").await);

    // A source without logical decoding: `logical` is refused, `auto` picks `copy`.
    let restart_with = async |wal_level: &str| {
        t.shard("shard_1")
            .await
            .batch_execute(&format!("ALTER SYSTEM SET wal_level = {wal_level}"))
            .await
            .unwrap();
        t.shard_cluster("shard_1").stop();
        t.shard_cluster("shard_1").restart();
    };
    restart_with("replica").await;
    refused(
        &t,
        MethodChoice::Logical,
        "shard_2",
        &[
            "source shard shard_1 has wal_level = replica",
            "or use --method copy",
        ],
    )
    .await;
    let plan = t
        .mover(MoveOptions::default())
        .plan(&tenant("a"), "shard_2")
        .await
        .unwrap();
    assert_eq!(plan.method, Method::Copy);
    restart_with("logical").await;
    // Connected after the restart.
    let s1 = t.shard("shard_1").await;

    refused(
        &t,
        MethodChoice::Auto,
        "shard_9",
        &["shard \"shard_9\" is not in shard_directory.shards"],
    )
    .await;
    dba.batch_execute(
        "UPDATE shard_directory.shards SET conninfo = NULL WHERE shard_name = 'shard_3'",
    )
    .await
    .unwrap();
    refused(
        &t,
        MethodChoice::Auto,
        "shard_3",
        &[
            "shard \"shard_3\" has no conninfo",
            "UPDATE shard_directory.shards",
        ],
    )
    .await;

    s2.batch_execute("SELECT shard_directory.unprotect('order_lines')")
        .await
        .unwrap();
    refused(
        &t,
        MethodChoice::Auto,
        "shard_2",
        &[
            "table public.order_lines exists on target shard shard_2 but is not protected",
            "fix: SELECT shard_directory.protect('public.order_lines', 'tenant_id', 'tenant')",
        ],
    )
    .await;
    s2.batch_execute("DROP TABLE order_lines").await.unwrap();
    refused(
        &t,
        MethodChoice::Auto,
        "shard_2",
        &["table public.order_lines is missing on target shard shard_2"],
    )
    .await;

    s1.batch_execute("ALTER TABLE orders ADD COLUMN note text")
        .await
        .unwrap();
    refused(
        &t,
        MethodChoice::Auto,
        "shard_3",
        &["shard \"shard_3\" has no conninfo"],
    )
    .await;
    dba.execute(
        "UPDATE shard_directory.shards SET conninfo = $1 WHERE shard_name = 'shard_3'",
        &[&t.shard_cluster("shard_3").conn_str("app")],
    )
    .await
    .unwrap();
    refused(
        &t,
        MethodChoice::Auto,
        "shard_3",
        &[
            "column public.orders.note (text) is missing on target shard shard_3",
            "fix: ALTER TABLE public.orders ADD COLUMN note text on shard shard_3",
        ],
    )
    .await;
    s3.batch_execute("ALTER TABLE orders ADD COLUMN note varchar(10)")
        .await
        .unwrap();
    refused(
        &t,
        MethodChoice::Auto,
        "shard_3",
        &["column public.orders.note is character varying(10) on target shard shard_3 but text"],
    )
    .await;
    s3.batch_execute("ALTER TABLE orders ALTER COLUMN note TYPE text")
        .await
        .unwrap();

    s1.batch_execute(
        "ALTER TABLE order_lines REPLICA IDENTITY USING INDEX order_lines_pkey; \
                      ALTER TABLE orders REPLICA IDENTITY NOTHING",
    )
    .await
    .unwrap();
    refused(
        &t,
        MethodChoice::Logical,
        "shard_3",
        &[
            "table public.orders on source shard shard_1: the replica identity of public.orders \
             does not include the key column tenant_id",
            "ALTER TABLE public.orders REPLICA IDENTITY USING INDEX public.orders_pkey",
        ],
    )
    .await;
    s1.batch_execute("ALTER TABLE orders REPLICA IDENTITY FULL")
        .await
        .unwrap();

    s3.batch_execute(
        "BEGIN; SELECT set_config('app.directory_version', '100', true);
         INSERT INTO orders (tenant_id, item) VALUES ('a', 'stray'); COMMIT",
    )
    .await
    .unwrap();
    refused(
        &t,
        MethodChoice::Logical,
        "shard_3",
        &["target shard shard_3 already has rows of tenant/a in table public.orders"],
    )
    .await;
    s3.batch_execute(
        "BEGIN; SELECT set_config('app.directory_version', '100', true);
         DELETE FROM orders WHERE tenant_id = 'a'; COMMIT",
    )
    .await
    .unwrap();

    // What passes preflight: the plan, then the move.
    let plan = t
        .mover(MoveOptions::default())
        .plan(&tenant("a"), "shard_3")
        .await
        .unwrap();
    assert_eq!(plan.method, Method::Logical);
    assert_eq!(
        plan.tables,
        [
            ("public.orders".to_owned(), 3),
            ("public.order_lines".to_owned(), 6)
        ]
    );
    let record = t
        .mover(MoveOptions::default())
        .start(&tenant("a"), "shard_3")
        .await
        .unwrap();
    assert_moved(&t, &record, "a", (3, 6)).await;
}

#[tokio::test]
async fn cleanup_drops_what_finished_moves_left_and_nothing_of_open_ones() {
    let t = Topology::with_shards("cleanup", 2).await;
    for id in ["done", "open"] {
        t.add_tenant(id, "shard_1").await;
        seed(&t, "shard_1", id, 3).await;
    }
    let done = t
        .mover(MoveOptions::default())
        .start(&tenant("done"), "shard_2")
        .await
        .unwrap();
    let open = crash_at(
        &t,
        MethodChoice::Logical,
        "open",
        "shard_2",
        Phase::CatchingUp,
    )
    .await;
    // What a finished move could leave behind when a shard was unreachable as it ended.
    let name = &done.replication_name;
    let s1 = t.shard("shard_1").await;
    s1.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[name],
    )
    .await
    .unwrap();
    s1.batch_execute(&format!("CREATE PUBLICATION {name} FOR TABLE orders"))
        .await
        .unwrap();
    let dropped = t.mover(MoveOptions::default()).cleanup().await.unwrap();
    assert_eq!(
        dropped,
        [
            format!("slot {name} on shard_1"),
            format!("publication {name} on shard_1")
        ]
    );
    let left = replication_objects(&t).await;
    let open_name = format!("sd_move_{open}");
    assert!(
        !left.is_empty() && left.iter().all(|o| o.ends_with(&open_name)),
        "{left:?}"
    );
    assert!(t
        .mover(MoveOptions::default())
        .cleanup()
        .await
        .unwrap()
        .is_empty());
    let record = t.mover(MoveOptions::default()).resume(open).await.unwrap();
    assert_moved(&t, &record, "open", (3, 6)).await;
}

#[tokio::test]
async fn a_partitioned_table_moves_through_its_root() {
    let t = Topology::with_shards("partitioned", 2).await;
    for (shard, _) in &t.shards {
        t.shard(shard)
            .await
            .batch_execute(
                "CREATE TABLE events (tenant_id text NOT NULL, id bigint NOT NULL, payload text,
                                      PRIMARY KEY (tenant_id, id)) PARTITION BY HASH (tenant_id);
                 CREATE TABLE events_0 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 0);
                 CREATE TABLE events_1 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 1);
                 SELECT shard_directory.protect('events', 'tenant_id', 'tenant');",
            )
            .await
            .unwrap();
    }
    t.add_tenant("a", "shard_1").await;
    t.add_tenant("b", "shard_1").await;
    seed(&t, "shard_1", "a", 20).await;
    t.shard("shard_1")
        .await
        .batch_execute(
            "BEGIN; SELECT set_config('app.directory_version', '100', true);
             INSERT INTO events SELECT t, g, 'e' FROM unnest(ARRAY['a', 'b']) t, generate_series(1, 50) g;
             COMMIT",
        )
        .await
        .unwrap();
    let events = async |shard: &str, id: &str| -> i64 {
        t.shard(shard)
            .await
            .query_one("SELECT count(*) FROM events WHERE tenant_id = $1", &[&id])
            .await
            .unwrap()
            .get(0)
    };
    for (method, to, events_on_1_and_2) in [
        (MethodChoice::Logical, "shard_2", (0, 50)),
        (MethodChoice::Copy, "shard_1", (50, 0)),
    ] {
        let record = t.mover(options(method)).start(&tenant("a"), to).await;
        let record = record.unwrap_or_else(|e| panic!("{e}"));
        assert_moved(&t, &record, "a", (20, 40)).await;
        assert_eq!(
            (events("shard_1", "a").await, events("shard_2", "a").await),
            events_on_1_and_2
        );
        assert_eq!(
            events("shard_1", "b").await,
            50,
            "the other tenant's rows in the same partitions stay"
        );
    }
}
