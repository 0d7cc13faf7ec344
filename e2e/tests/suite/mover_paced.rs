//! The logical method's initial copy when a pace is asked for (`--max-rate`, `--max-lag`): the
//! mover copies from a snapshot that matches its slot, so writes of every kind made around the
//! snapshot are carried exactly once; the copy keeps to the pace; and a copy stopped midway is
//! made again from the start, paced or not.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use shard_directory_client::{EntityKey, Router};
use shard_directory_e2e::{eventually, Topology};
use shard_directory_mover::{Method, MethodChoice, MoveOptions, Observer, Phase};
use tokio::sync::watch;

const SEEDED: i64 = 600;

fn paced(rate: u64) -> MoveOptions {
    MoveOptions {
        method: MethodChoice::Logical,
        max_rate: Some(rate),
        ..Default::default()
    }
}

type Action = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// When the move entered each phase; and what to do when it enters one, if anything.
#[derive(Default)]
struct PhaseClock {
    entered: Mutex<BTreeMap<String, Instant>>,
    act: Option<(Phase, Action)>,
}

impl Observer for PhaseClock {
    fn phase(&self, _move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        self.entered
            .lock()
            .unwrap()
            .insert(phase.to_string(), Instant::now());
        match &self.act {
            Some((at, act)) if *at == phase => act(),
            _ => Box::pin(std::future::ready(())),
        }
    }
}

impl PhaseClock {
    fn at(&self, phase: Phase) -> Instant {
        self.entered.lock().unwrap()[&phase.to_string()]
    }

    fn between(&self, from: Phase, to: Phase) -> Duration {
        self.at(to) - self.at(from)
    }
}

/// One transaction of tenant `a`'s application: a new order, a seeded order renamed and the
/// lines of another deleted (rows the copy's snapshot holds).
async fn edit(router: &Router, n: i64) -> Result<(), shard_directory_client::Error> {
    router
        .run(&EntityKey::new("tenant", "a"), async |tx| {
            tx.execute(
                "INSERT INTO orders (tenant_id, item) VALUES ('a', $1)",
                &[&format!("live {n}")],
            )
            .await?;
            tx.execute(
                "UPDATE orders SET item = $2 WHERE tenant_id = 'a' AND item = $1",
                &[&format!("seed a {n}"), &format!("edited {n}")],
            )
            .await?;
            tx.execute(
                "DELETE FROM order_lines WHERE tenant_id = 'a' AND order_id = \
                 (SELECT order_id FROM orders WHERE tenant_id = 'a' AND item = $1)",
                &[&format!("seed a {}", SEEDED + 1 - n)],
            )
            .await?;
            Ok(())
        })
        .await
}

/// Edits tenant `a` until told to stop; returns the orders' items and the line count the
/// acknowledged transactions leave.
async fn keep_editing(t: &Topology, stop: watch::Receiver<bool>) -> (Vec<String>, i64) {
    let router = t.connected_router().await;
    let mut items: BTreeMap<i64, String> =
        (1..=SEEDED).map(|g| (g, format!("seed a {g}"))).collect();
    let (mut lines, mut live, mut n) = (2 * SEEDED, Vec::new(), 0);
    while !*stop.borrow() {
        n += 1;
        match edit(&router, n).await {
            Ok(()) => {
                live.push(format!("live {n}"));
                if n <= SEEDED {
                    items.insert(n, format!("edited {n}"));
                }
                // Past half the seed, the order to empty was renamed already: nothing is deleted.
                if n <= SEEDED / 2 {
                    lines -= 2;
                }
            }
            Err(e) => {
                assert!(
                    e.is_retryable(),
                    "only retryable refusals while moving: {e}"
                );
                n -= 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut all: Vec<String> = items.into_values().chain(live).collect();
    all.sort();
    (all, lines)
}

/// 1,800 rows at 600 a second: the initial copy takes 3 s, and every insert, update and delete
/// the application commits meanwhile (also while the snapshot is taken) is on the target once.
#[tokio::test]
async fn a_paced_copy_keeps_to_max_rate_and_carries_every_write_around_its_snapshot() {
    let t = Topology::with_shards("paced", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", SEEDED, 2).await;
    let clock = Arc::new(PhaseClock::default());
    let (stop, stopped) = watch::channel(false);
    let mover = async {
        let record = t
            .mover(paced(600))
            .with_observer(clock.clone())
            .start(&EntityKey::new("tenant", "a"), "shard_2")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        stop.send_replace(true);
        record
    };
    let (record, (items, lines)) = tokio::join!(mover, keep_editing(&t, stopped));
    assert_eq!(
        (record.method, record.phase),
        (Method::Logical, Phase::Done)
    );
    let copy = clock.between(Phase::Copying, Phase::CatchingUp);
    assert!(copy >= Duration::from_millis(2_800), "copied in {copy:?}");
    assert!(
        items.iter().any(|i| i.starts_with("edited")),
        "the application wrote"
    );
    assert_eq!(t.orders("shard_2", "a").await, items);
    assert_eq!(t.rows("shard_2", "a").await.1, lines);
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
    // Counted by the mover as it copied: every seeded order, and those added before the snapshot.
    let copied = record.tables["public.orders"].copied;
    assert!(
        (SEEDED..SEEDED + items.len() as i64).contains(&copied),
        "{copied}"
    );
    assert!(t.replication_objects().await.is_empty());
}

/// Runs `work` until rows are being copied into shard_2, then drops it, as a crash would.
async fn crash_midway<T: std::fmt::Debug>(
    t: &Topology,
    work: impl std::future::Future<Output = T>,
) {
    let target = t.shard("shard_2").await;
    let midway = eventually(
        "rows copied into shard_2",
        Duration::from_secs(30),
        || async {
            target
                .query_one(
                    "SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy \
                 WHERE command = 'COPY FROM'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                .gt(&0)
                .then_some(())
        },
    );
    tokio::select! {
        r = work => panic!("the move should have been stopped midway: {r:?}"),
        () = midway => {}
    }
}

/// A paced copy stopped midway is made again from the start when resumed with a pace, and by the
/// subscription when resumed without one; no row is lost or doubled.
#[tokio::test]
async fn a_paced_copy_stopped_midway_is_made_again_from_the_start() {
    let t = Topology::with_shards("paced-crash", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", SEEDED, 2).await;
    let key = EntityKey::new("tenant", "a");
    let slow = t.mover(paced(300));
    crash_midway(&t, slow.start(&key, "shard_2")).await;
    let move_id = shard_directory_e2e::observe::open_move(&t, &key).await;
    crash_midway(&t, slow.resume(move_id)).await;
    assert_eq!(
        t.rows("shard_2", "a").await,
        (0, 0),
        "a copy is all or nothing"
    );
    let record = t
        .mover(MoveOptions {
            method: MethodChoice::Logical,
            ..Default::default()
        })
        .resume(move_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(t.rows("shard_2", "a").await, (SEEDED, 2 * SEEDED));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
    assert!(t.replication_objects().await.is_empty());
}

/// With `--max-lag` alone the copy is the mover's too, and waits while the target's standby is
/// further behind in replay: here it stops replaying as the copy begins (2 MB behind, over
/// `--max-lag 1MB`) and goes on a second later.
#[tokio::test]
async fn a_paced_copy_waits_while_the_targets_standby_lags() {
    let t = Topology::with_shards("paced-lag", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", SEEDED, 2).await;
    let standby = t.shard_cluster("shard_2").standby("paced-lag-standby");
    let replica = Arc::new(standby.connect("app").await);
    let writer = Arc::new(t.shard("shard_2").await);
    let resumed = Arc::new(Mutex::new(None));
    let lagging: Action = Box::new({
        let (replica, resumed, writer) = (replica.clone(), resumed.clone(), writer.clone());
        move || {
            let (replica, resumed, writer) = (replica.clone(), resumed.clone(), writer.clone());
            Box::pin(async move {
                shard_directory_e2e::lag_for_a_second(replica, &writer, resumed).await;
            })
        }
    });
    let clock = Arc::new(PhaseClock {
        act: Some((Phase::Copying, lagging)),
        ..Default::default()
    });
    let record = t
        .mover(MoveOptions {
            method: MethodChoice::Logical,
            max_lag: Some(1 << 20),
            ..Default::default()
        })
        .with_observer(clock.clone())
        .start(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(t.rows("shard_2", "a").await, (SEEDED, 2 * SEEDED));
    let resumed = resumed.lock().unwrap().expect("replay resumed");
    assert!(
        clock.at(Phase::CatchingUp) > resumed,
        "the copy ended before the standby replayed again"
    );
}
