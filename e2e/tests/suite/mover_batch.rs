//! Many moves from one plan, as an operator runs them: `drain` writes a plan file, a person
//! edits it, `move --from-file` runs it two moves at once, is killed in the middle, and run
//! again goes on where it stopped; `split` and `rebalance` plan from the shards' own sizes. A
//! batch's runner waits out its directory as a move does, and reports a move found aborted as
//! the failure it is.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use shard_directory_client::DirectoryConfig;
use shard_directory_e2e::mover_cli::{command, open_phase, succeeded, text, Held};
use shard_directory_e2e::observe::{hold_at, until_held};
use shard_directory_e2e::workload::{Audit, Ledger, Workload};
use shard_directory_e2e::{eventually, Topology};
use shard_directory_mover::{drain, BatchOptions, Method, MoveOptions, Outcome, Phase, Weigh};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

const TENANTS: [(&str, i64); 6] = [
    ("1", 60),
    ("2", 50),
    ("3", 40),
    ("4", 30),
    ("5", 20),
    ("6", 10),
];

async fn cli(t: &Topology, args: &[&str]) -> std::process::Output {
    command(t)
        .args(args)
        .output()
        .await
        .expect("run shard-directory")
}

async fn last_batch(t: &Topology) -> i64 {
    t.dba()
        .await
        .query_one(
            "SELECT max(batch_id) FROM shard_directory.shard_move_batches",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// A plan file moving each of `tenants` from shard_1 to shard_2, as a person would write it (in
/// the topology's scratch folder, removed with it).
fn plan_file(t: &Topology, name: &str, tenants: &[&str]) -> PathBuf {
    let moves: Vec<Value> = tenants
        .iter()
        .map(|id| serde_json::json!({"entity_type": "tenant", "entity_id": id, "from": "shard_1", "to": "shard_2"}))
        .collect();
    let file = t.directory.scratch_path(&format!("{name}.json"));
    std::fs::write(&file, serde_json::json!({ "moves": moves }).to_string()).unwrap();
    file
}

fn plan_moves(plan: &Value) -> Vec<(String, String)> {
    plan["moves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["entity_id"].as_str().unwrap().to_owned(),
                m["to"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_shard_is_drained_by_an_edited_plan_run_again_after_a_kill() {
    let t = Topology::with_shards("batch", 3).await;
    for (id, orders) in TENANTS {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, orders, 2).await;
    }
    t.add_tenant("x", "shard_2").await;
    t.seed_orders("shard_2", "x", 100, 2).await;

    // The plan, by rows: heaviest first to the lighter target; shard_2 starts 300 rows ahead.
    let file = t.directory.scratch_path("drain.json");
    let path = file.to_str().unwrap();
    succeeded(
        &cli(
            &t,
            &[
                "drain",
                "shard_1",
                "--to",
                "shard_2,shard_3",
                "--by",
                "rows",
                "--out",
                path,
            ],
        )
        .await,
    );
    let mut plan: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(plan["purpose"], "drain shard_1");
    assert_eq!(plan["shards"]["shard_1"]["before"]["rows"], 630);
    assert_eq!(plan["shards"]["shard_1"]["after"]["rows"], 0);
    let planned = plan_moves(&plan);
    let to: Vec<(&str, &str)> = planned
        .iter()
        .map(|(id, to)| (id.as_str(), to.as_str()))
        .collect();
    assert_eq!(
        to,
        [
            ("1", "shard_3"),
            ("2", "shard_3"),
            ("3", "shard_2"),
            ("4", "shard_3"),
            ("5", "shard_2"),
            ("6", "shard_3")
        ]
    );
    // A person keeps tenant 6 where it is.
    plan["moves"]
        .as_array_mut()
        .unwrap()
        .retain(|m| m["entity_id"] != "6");
    std::fs::write(&file, serde_json::to_string_pretty(&plan).unwrap()).unwrap();

    // Run it, two moves at a time, and kill it once the third move has begun.
    let mut child = command(&t)
        .args(["move", "--from-file", path, "--method", "copy"])
        .args(["--parallel", "2", "--per-shard", "2"])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    let killed_in = loop {
        if let Some((_, phase)) = open_phase(&t, "3").await {
            child.kill().await.unwrap();
            break phase;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the third move never began"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(killed_in != Phase::Done, "{killed_in:?}");
    let batch = last_batch(&t).await.to_string();
    let status = succeeded(&cli(&t, &["batch", "status", &batch]).await);
    assert!(
        status.contains(&format!(
            "batch {batch} running: drain shard_1 (5 moves, --parallel 2 --per-shard 2 \
             --method copy --max-freeze 10s)"
        )),
        "{status}"
    );
    assert!(
        status.contains(": done (move "),
        "one move had finished: {status}"
    );
    assert!(
        status.contains("tenant/5 shard_1 -> shard_2: pending"),
        "{status}"
    );

    // The batch goes on where it stopped: what is done skipped, what was open resumed, the
    // rest started.
    let out = succeeded(&cli(&t, &["batch", "resume", &batch]).await);
    assert!(out.contains("is on shard_3 already"), "{out}");
    for (id, target) in &to[..5] {
        assert_eq!(t.placement(id).await, *target, "{out}");
        let orders = TENANTS.iter().find(|(i, _)| i == id).unwrap().1;
        assert_eq!(
            t.rows(target, id).await,
            (orders, orders * 2),
            "tenant {id} on {target}"
        );
        assert_eq!(
            t.rows("shard_1", id).await,
            (0, 0),
            "tenant {id} left on shard_1"
        );
    }
    assert_eq!(t.placement("6").await, "shard_1");
    assert_eq!(t.rows("shard_1", "6").await, (10, 20));
    // Nothing left open, and a third run has nothing to do.
    let open = succeeded(&cli(&t, &["list", "--open"]).await);
    assert!(open.is_empty(), "{open}");
    let status = succeeded(&cli(&t, &["batch", "status", &batch]).await);
    assert!(status.contains(&format!("batch {batch} done")), "{status}");
    assert_eq!(status.matches(": done (move ").count(), 5, "{status}");
    let again = succeeded(&cli(&t, &["move", "--from-file", path]).await);
    assert_eq!(again.matches("skipped").count(), 5, "{again}");
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test]
async fn split_and_rebalance_plan_from_the_shards_own_sizes() {
    let t = Topology::with_shards("batch-plan", 3).await;
    for (id, orders) in TENANTS {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, orders, 2).await;
    }
    // Half of shard_1's 630 rows (each tenant: its orders and two lines per order): 180 + 120;
    // 150, 90, 60 and 30 would each overshoot what is left.
    let split: Value = serde_json::from_str(&succeeded(
        &cli(
            &t,
            &[
                "split",
                "shard_1",
                "--to",
                "shard_2",
                "--fraction",
                "0.5",
                "--by",
                "rows",
            ],
        )
        .await,
    ))
    .unwrap();
    let moved: Vec<String> = plan_moves(&split).into_iter().map(|(id, _)| id).collect();
    assert_eq!(moved, ["1", "3"], "{split}");
    assert_eq!(split["shards"]["shard_2"]["after"]["rows"], 300);
    // Rebalance across three shards: every shard ends within a tenant of the mean (210 rows).
    let rebalance: Value =
        serde_json::from_str(&succeeded(&cli(&t, &["rebalance", "--by", "rows"]).await)).unwrap();
    let after: Vec<i64> = ["shard_1", "shard_2", "shard_3"]
        .iter()
        .map(|s| rebalance["shards"][s]["after"]["rows"].as_i64().unwrap())
        .collect();
    assert_eq!(after.iter().sum::<i64>(), 630);
    assert!(after.iter().all(|r| (r - 210).abs() <= 90), "{after:?}");
    // By load (the shards' entity_stats()): tenant 6 is the hottest; a tenant with no
    // transactions is never moved for load.
    let shard_1 = t.shard("shard_1").await;
    for (id, transactions) in [("4", 5), ("5", 10), ("6", 40)] {
        for _ in 0..transactions {
            shard_1
                .batch_execute(&format!(
                    "BEGIN; SELECT set_config('app.directory_version', '100', true),
                            set_config('app.entity_type', 'tenant', true),
                            set_config('app.entity_id', '{id}', true);
                     SELECT shard_directory.assert_directory_version(); COMMIT;"
                ))
                .await
                .unwrap();
        }
    }
    let by_load: Value =
        serde_json::from_str(&succeeded(&cli(&t, &["rebalance", "--by", "load"]).await)).unwrap();
    let moved = plan_moves(&by_load);
    assert_eq!(
        moved.first().map(|(id, _)| id.as_str()),
        Some("6"),
        "{by_load}"
    );
    assert!(
        moved
            .iter()
            .all(|(id, _)| ["4", "5", "6"].contains(&id.as_str())),
        "{by_load}"
    );
    // A plan is only a plan: nothing moved.
    for (id, _) in TENANTS {
        assert_eq!(t.placement(id).await, "shard_1");
    }
}

#[tokio::test]
async fn a_batch_paused_starts_no_more_moves_and_aborted_undoes_its_open_one() {
    let t = Topology::start("batch-pause").await;
    for (id, orders) in [("1", 2_000), ("2", 2_000), ("3", 10), ("4", 10)] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, orders, 2).await;
    }
    let file = plan_file(&t, "pause", &["1", "2", "3", "4"]);
    let path = file.to_str().unwrap();
    let wait_for_move_of = async |id: &str| {
        let started = Instant::now();
        while open_phase(&t, id).await.is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "tenant {id}'s move never began"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };

    // Paused while its first move runs (a checked transaction on shard_1 keeps it from freezing
    // until the pause is recorded): that move goes on to its end, no other starts.
    let (blocker, _) = t.idle_checked_transaction("shard_1").await;
    let child = command(&t)
        .args(["move", "--from-file", path, "--method", "copy"])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for_move_of("1").await;
    let batch = last_batch(&t).await.to_string();
    let paused = succeeded(&cli(&t, &["batch", "pause", &batch]).await);
    assert!(
        paused.contains(&format!("batch {batch} paused")),
        "{paused}"
    );
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let out = succeeded(
        &tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .unwrap()
            .unwrap(),
    );
    assert!(out.contains("tenant/1 shard_1 -> shard_2: moved"), "{out}");
    assert!(
        out.contains("tenant/2 shard_1 -> shard_2: not started"),
        "{out}"
    );
    assert_eq!(t.placement("1").await, "shard_2");
    assert_eq!(t.placement("2").await, "shard_1");

    // Resumed, and aborted while its second move runs (a checked transaction on shard_1 keeps
    // it from freezing until the abort is done): that move is undone, none other starts.
    let (blocker, _) = t.idle_checked_transaction("shard_1").await;
    let resumed = command(&t)
        .args(["batch", "resume", &batch])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for_move_of("2").await;
    let aborted = succeeded(&cli(&t, &["batch", "abort", &batch]).await);
    assert!(
        aborted.contains(&format!("batch {batch} aborted")),
        "{aborted}"
    );
    assert!(
        aborted.contains("tenant/2 shard_1 -> shard_2: aborted (move "),
        "{aborted}"
    );
    assert!(
        aborted.contains("tenant/3 shard_1 -> shard_2: pending"),
        "{aborted}"
    );
    // The resumed batch made its move as the batch was started: by copy.
    assert!(
        aborted.contains("--method copy --max-freeze 10s"),
        "{aborted}"
    );
    let moves = t.mover(MoveOptions::default()).list(false, None).await;
    let methods: Vec<Method> = moves.unwrap().iter().map(|r| r.method).collect();
    assert_eq!(methods, [Method::Copy, Method::Copy]);
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(120), resumed.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.code().is_some(), "the runner ended: {out:?}");
    assert_eq!(
        t.entry("tenant", "2").await,
        ("shard_1".to_owned(), "active".to_owned())
    );
    assert_eq!(t.rows("shard_1", "2").await, (2_000, 4_000));
    assert_eq!(t.rows("shard_2", "2").await, (0, 0));
    assert_eq!(
        t.fence("shard_1", "2").await,
        None,
        "tenant 2 is writable on shard_1 again"
    );
    for id in ["3", "4"] {
        assert_eq!(t.placement(id).await, "shard_1");
    }
    // An aborted batch does not resume.
    let refused = cli(&t, &["batch", "resume", &batch]).await;
    assert_eq!(refused.status.code(), Some(1));
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test]
async fn a_plan_leaves_a_tenant_whose_copy_would_outlast_max_freeze() {
    let t = Topology::with_shards("batch-budget", 2).await;
    for (id, orders) in [("history", 1000), ("big", 10_000), ("small", 50)] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, orders, 2).await;
    }
    // One copy move from shard_1 is the shard's history: its freeze per row prices the others.
    let moved = cli(
        &t,
        &[
            "--json", "move", "tenant", "history", "--to", "shard_2", "--method", "copy",
        ],
    )
    .await;
    let record: Value = serde_json::from_str(&succeeded(&moved)).unwrap();
    let freeze_ms = record["max_freeze_seen_ms"].as_i64().unwrap().max(1);
    // A budget of the history tenant's own freeze (3,000 rows): 'big' (30,000) is about ten
    // times over it, 'small' (150) well under.
    let budget = format!("{freeze_ms}ms");
    let planned = cli(
        &t,
        &[
            "drain",
            "shard_1",
            "--by",
            "rows",
            "--method",
            "copy",
            "--max-freeze",
            &budget,
        ],
    )
    .await;
    let plan: Value = serde_json::from_str(&succeeded(&planned)).unwrap();
    assert_eq!(plan_moves(&plan), [("small".into(), "shard_2".into())]);
    let skipped = plan["skipped"].as_array().expect("skipped listed");
    assert_eq!(skipped.len(), 1, "{plan}");
    assert_eq!(skipped[0]["entity_id"], "big");
    let estimated = skipped[0]["freeze_ms"].as_u64().unwrap() as f64;
    let expected = freeze_ms as f64 * 10.0;
    assert!(
        (expected * 0.8..=expected * 1.2).contains(&estimated),
        "{estimated} ms for 'big', from {freeze_ms} ms for 3,000 rows"
    );
    let said = String::from_utf8_lossy(&planned.stderr);
    assert!(
        said.contains("left where it is: tenant/big on shard_1"),
        "{said}"
    );
    // The logical method's freeze does not grow with the tenant: nothing is left.
    let planned = cli(&t, &["drain", "shard_1", "--max-freeze", &budget]).await;
    let plan: Value = serde_json::from_str(&succeeded(&planned)).unwrap();
    assert_eq!(plan_moves(&plan).len(), 2);
    assert!(plan.get("skipped").is_none(), "{plan}");
}

#[tokio::test]
async fn a_batch_stopped_after_a_moves_cutover_finishes_that_move_when_resumed() {
    let t = Topology::with_shards("batch-cutover", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 20, 2).await;
    let mover = t.mover(MoveOptions::default());
    let fleet = mover.fleet(false).await.unwrap();
    let plan = drain(&fleet, "shard_1", &[], Weigh::Rows).unwrap();
    let one = BatchOptions {
        parallel: 1,
        per_shard: 1,
    };
    let batch = mover.record_batch(&plan, one).await.unwrap();
    // The runner stops dead once the move has cut over: the entry is on the target, the
    // source's rows not yet deleted.
    let (hold, reached) = hold_at(Phase::CleaningUp);
    let held = t.mover(MoveOptions::default()).with_observer(hold);
    until_held(&reached, "the batch", held.resume_batch(batch)).await;
    drop(held);
    assert_eq!(t.placement("a").await, "shard_2");
    assert_eq!(t.rows("shard_1", "a").await, (20, 40));
    // Resumed, the batch finishes that move rather than skip it as already there.
    let run = mover.resume_batch(batch).await.unwrap();
    assert!(run.stopped.is_none(), "{:?}", run.stopped);
    match &run.moves[..] {
        [(_, Outcome::Moved(record))] => assert_eq!(record.phase, Phase::Done),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.rows("shard_1", "a").await, (0, 0), "the source cleared");
    assert_eq!(t.rows("shard_2", "a").await, (20, 40));
}

/// The rows `fleet` weighs each of `ids` at, and the shards whose sizes it read as kept.
async fn weighed(t: &Topology, options: MoveOptions, ids: &[&str]) -> (Vec<i64>, Vec<String>) {
    let fleet = t.mover(options).fleet(false).await.unwrap();
    let rows = ids
        .iter()
        .map(|id| {
            let placed = fleet.entities.iter().find(|p| p.key.entity_id == *id);
            placed.expect("placed").size.rows
        })
        .collect();
    (rows, fleet.sizes_kept.keys().cloned().collect())
}

/// A plan reads the sizes the directory keeps from the last measure (here planted, to tell them
/// apart), until they are older than `--sizes-max-age` or the shard has been given an entity
/// since; the CLI says which shards' sizes it read so.
#[tokio::test]
async fn plans_read_the_kept_sizes_until_they_age_or_a_shard_gains_an_entity() {
    let t = Topology::with_shards("sizes", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 20, 2).await;
    t.add_tenant("b", "shard_2").await;
    t.seed_orders("shard_2", "b", 5, 2).await;
    let fresh = MoveOptions::default;
    assert_eq!(
        weighed(&t, fresh(), &["a", "b"]).await,
        (vec![60, 15], vec![])
    );
    let dba = t.dba().await;
    let plant = |shard: &'static str, sql: &'static str| {
        let dba = &dba;
        async move {
            dba.execute(sql, &[&shard]).await.unwrap();
        }
    };
    plant(
        "shard_1",
        "UPDATE shard_directory.shard_sizes SET sizes = jsonb_set(sizes, '{tenant,a}', '[1000, 1]') \
         WHERE shard_name = $1",
    )
    .await;
    let both = vec!["shard_1".to_owned(), "shard_2".to_owned()];
    assert_eq!(
        weighed(&t, fresh(), &["a", "b"]).await,
        (vec![1000, 15], both.clone())
    );
    let said = cli(&t, &["drain", "shard_2"]).await;
    succeeded(&said);
    let said = String::from_utf8_lossy(&said.stderr);
    assert!(
        said.contains("shard_1: rows and bytes as measured"),
        "{said}"
    );

    // A shard given an entity since is measured again; the other is still read as kept.
    t.add_tenant("c", "shard_2").await;
    assert_eq!(
        weighed(&t, fresh(), &["a", "b", "c"]).await,
        (vec![1000, 15, 0], vec!["shard_1".to_owned()])
    );
    // Older than --sizes-max-age (10 min): measured again.
    plant(
        "shard_1",
        "UPDATE shard_directory.shard_sizes SET measured_at = now() - interval '11 minutes' \
         WHERE shard_name = $1",
    )
    .await;
    assert_eq!(
        weighed(&t, fresh(), &["a"]).await,
        (vec![60], vec!["shard_2".to_owned()])
    );
    // --sizes-max-age 0s: every shard measured.
    plant(
        "shard_1",
        "UPDATE shard_directory.shard_sizes SET sizes = jsonb_set(sizes, '{tenant,a}', '[1000, 1]') \
         WHERE shard_name = $1",
    )
    .await;
    let measure = MoveOptions {
        sizes_max_age: Duration::ZERO,
        ..MoveOptions::default()
    };
    assert_eq!(
        weighed(&t, measure, &["a", "b", "c"]).await,
        (vec![60, 15, 0], vec![])
    );
}

const MINUTE: Duration = Duration::from_secs(60);

/// Waits until the runner is held at `held`'s failpoint; fails at once if it ends first.
async fn reached(held: &Held, runner: &mut Child) {
    while_running(runner, "the failpoint to be reached", async || {
        held.is_reached()
    })
    .await;
}

/// Waits (up to a minute) until `check` holds while `runner` runs; fails at once, with its
/// stderr, if it ends first.
async fn while_running(runner: &mut Child, what: &str, check: impl AsyncFn() -> bool) {
    let ended = eventually(what, MINUTE, || {
        let exited = runner.try_wait().expect("the runner's status");
        let check = &check;
        async move {
            match check().await {
                true => Some(None),
                false => exited.map(Some),
            }
        }
    })
    .await;
    if let Some(status) = ended {
        let mut said = String::new();
        if let Some(mut stderr) = runner.stderr.take() {
            tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut said)
                .await
                .unwrap();
        }
        panic!("the batch's runner ended ({status}) before {what}:\n{said}");
    }
}

/// The backend holding batch `batch`'s lock (class 'SDBT', the mover's `BATCH_LOCK_CLASS`).
async fn batch_runner(t: &Topology, batch: i64) -> Option<i32> {
    t.dba()
        .await
        .query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 \
               AND classid = 1396982356::int8::oid AND objid = $1::int8::oid",
            &[&batch],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Tenants on shard_1 with `orders` orders each, and writers writing to them through a router.
async fn written(t: &Topology, tenants: &[&str], orders: i64) -> Workload {
    let mut ledger = Ledger::default();
    for id in tenants {
        t.add_tenant(id, "shard_1").await;
        for item in t.seed_orders("shard_1", id, orders, 1).await {
            ledger.acked.insert(item, id.to_string());
        }
    }
    let d = t.client_directory(DirectoryConfig::default()).await;
    Workload::start(
        &[Arc::new(t.router(d))],
        tenants,
        2,
        Duration::from_millis(5),
        fastrand::u64(..),
        ledger,
    )
}

/// Once every tenant is active on shard_2 and written there again: the writers stopped, every
/// acknowledged write once on shard_2 and nowhere else, nothing left open.
async fn all_on_shard_2(t: &Topology, w: Workload, tenants: &[&str]) {
    for id in tenants {
        assert_eq!(
            t.entry("tenant", id).await,
            ("shard_2".to_owned(), "active".to_owned()),
            "tenant {id}"
        );
        let acked = |w: &Workload| w.ledger().acked.values().filter(|x| x == id).count();
        let before = acked(&w);
        eventually("the tenant written again", MINUTE, || async {
            (acked(&w) > before).then_some(())
        })
        .await;
    }
    let ledger = w.stop().await;
    assert!(ledger.fatal.is_empty(), "{:?}", ledger.fatal);
    let audit = Audit::of(t, &ledger).await;
    assert!(audit.holds(), "{}", audit.problems());
    for id in tenants {
        assert_eq!(audit.rows_of(id, "shard_1"), (0, 0), "tenant {id}");
    }
    let open = succeeded(&cli(t, &["list", "--open"]).await);
    assert!(open.is_empty(), "{open}");
}

/// The directory restarts (every session of the runner and of its moves cut) while a move of the
/// batch is frozen in its copy, writers writing: the runner connects again, takes its batch back
/// and drives it to `done`.
#[tokio::test]
async fn a_batch_waits_out_a_directory_restart_while_a_move_is_frozen() {
    let t = Topology::start("batch-restart").await;
    let tenants = ["1", "2", "3"];
    let w = written(&t, &tenants, 500).await;
    let plan = plan_file(&t, "restart", &tenants);
    let held = Held::new("restart");
    let mut runner = command(&t)
        .args([
            "move",
            "--from-file",
            plan.to_str().unwrap(),
            "--method",
            "copy",
        ])
        .args(["--max-freeze", "60s", "--parallel", "2", "--per-shard", "2"])
        .env("FAILPOINTS", held.at("copy.commit.Copy"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    reached(&held, &mut runner).await;
    let frozen: i64 = t
        .step("SELECT count(*) FROM shard_directory.shard_moves WHERE phase = 'frozen'")
        .await;
    assert!(frozen >= 1, "a move is frozen in its copy");
    let batch = last_batch(&t).await;
    assert!(batch_runner(&t, batch).await.is_some());

    t.directory.stop();
    t.directory.restart();
    // Without patience the runner's next read fails, and it returns, its moves dropped.
    while_running(
        &mut runner,
        "the runner to hold its batch again",
        async || batch_runner(&t, batch).await.is_some(),
    )
    .await;
    held.release();
    let out = tokio::time::timeout(2 * MINUTE, runner.wait_with_output())
        .await
        .expect("the batch ends")
        .unwrap();
    let report = succeeded(&out);
    assert_eq!(report.matches(": moved").count(), 3, "{report}");
    let status = succeeded(&cli(&t, &["batch", "status", &batch.to_string()]).await);
    assert!(status.contains(&format!("batch {batch} done")), "{status}");
    all_on_shard_2(&t, w, &tenants).await;
    std::fs::remove_file(&plan).unwrap();
}

/// The directory stays down longer than `--directory-patience`: the runner gives up, but only
/// once the move it runs (held in its freeze meanwhile) has stopped by itself, resumable; it
/// exits 3, and `batch resume` finishes the batch.
#[tokio::test]
async fn a_batch_whose_directory_stays_down_stops_after_its_move_and_resumes() {
    let t = Topology::start("batch-outage").await;
    let tenants = ["1", "2"];
    let w = written(&t, &tenants, 500).await;
    let plan = plan_file(&t, "outage", &tenants);
    let held = Held::new("outage");
    let mut runner = command(&t)
        .args([
            "--json",
            "--directory-patience",
            "2s",
            "move",
            "--from-file",
        ])
        .args([
            plan.to_str().unwrap(),
            "--method",
            "copy",
            "--max-freeze",
            "60s",
        ])
        .env("FAILPOINTS", held.at("copy.commit.Copy"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let said = Arc::new(Mutex::new(String::new()));
    let lines = runner.stderr.take().unwrap();
    tokio::spawn({
        let said = said.clone();
        async move {
            let mut lines = BufReader::new(lines).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                said.lock().unwrap().push_str(&(line + "\n"));
            }
        }
    });
    reached(&held, &mut runner).await;
    let batch = last_batch(&t).await;

    t.directory.stop();
    while_running(
        &mut runner,
        "the runner to give up on its directory",
        async || said.lock().unwrap().contains("starting no more moves"),
    )
    .await;
    // Still running: it waits for its move, held in its freeze.
    held.release();
    let out = tokio::time::timeout(MINUTE, runner.wait_with_output())
        .await
        .expect("the runner stops")
        .unwrap();
    let said = said.lock().unwrap().clone();
    assert_eq!(out.status.code(), Some(3), "{}{said}", text(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let moves = report["moves"].as_array().unwrap();
    // The move ended by itself (its own patience), not dropped: it is reported, resumable.
    assert_eq!(moves[0]["outcome"], "failed", "{report}");
    assert_eq!(moves[0]["left"], "resumable", "{report}");
    assert_eq!(moves[1]["outcome"], "not_started", "{report}");
    let stopped = report["stopped"].as_str().unwrap();
    assert!(
        stopped.contains(&format!(
            "batch {batch}: the directory did not answer within --directory-patience (2s)"
        )),
        "{stopped}"
    );

    t.directory.restart();
    let (_, phase) = open_phase(&t, "1").await.expect("its move open");
    assert!(phase < Phase::Cutover, "{phase}");
    let batch = batch.to_string();
    let status = succeeded(&cli(&t, &["batch", "status", &batch]).await);
    assert!(
        status.contains(&format!("batch {batch} running")),
        "{status}"
    );
    let out = succeeded(&cli(&t, &["batch", "resume", &batch]).await);
    assert_eq!(out.matches(": moved").count(), 2, "{out}");
    let status = succeeded(&cli(&t, &["batch", "status", &batch]).await);
    assert!(status.contains(&format!("batch {batch} done")), "{status}");
    all_on_shard_2(&t, w, &tenants).await;
    std::fs::remove_file(&plan).unwrap();
}

/// A move of the batch left aborting by another process (its runner killed in the freeze, the
/// abort killed once it had released the tenant): `batch resume` ends the abort and reports it
/// as the failure it is, exit 1, the batch not done; resumed again, the batch moves the tenant.
#[tokio::test]
async fn a_batch_move_that_ends_aborted_is_a_failure_and_the_batch_not_done() {
    let t = Topology::start("batch-aborted").await;
    for id in ["1", "2"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 20, 1).await;
    }
    let plan = plan_file(&t, "aborted", &["1", "2"]);
    let killed = command(&t)
        .args([
            "move",
            "--from-file",
            plan.to_str().unwrap(),
            "--method",
            "copy",
        ])
        .env("FAILPOINTS", "copy.commit.Copy=1*return(kill)")
        .output()
        .await
        .unwrap();
    assert_eq!(killed.status.code(), None, "killed: {killed:?}");
    let (move_id, phase) = open_phase(&t, "1").await.expect("its move open");
    assert_eq!(phase, Phase::Frozen);
    let killed = command(&t)
        .args(["abort", &move_id.to_string()])
        .env("FAILPOINTS", "abort.end_sessions.source=1*return(kill)")
        .output()
        .await
        .unwrap();
    assert_eq!(killed.status.code(), None, "killed: {killed:?}");
    assert_eq!(open_phase(&t, "1").await, Some((move_id, Phase::Aborting)));

    let batch = last_batch(&t).await.to_string();
    let out = cli(&t, &["--json", "batch", "resume", &batch]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["moves"][0]["outcome"], "failed", "{report}");
    assert_eq!(report["moves"][0]["left"], "aborted", "{report}");
    assert_eq!(report["moves"][0]["move_id"], move_id, "{report}");
    assert_eq!(report["moves"][1]["outcome"], "moved", "{report}");
    // As the directory says: tenant 1 active and writable on its source, with all its rows.
    assert_eq!(
        t.entry("tenant", "1").await,
        ("shard_1".to_owned(), "active".to_owned())
    );
    assert_eq!(t.fence("shard_1", "1").await, None);
    assert_eq!(t.rows("shard_1", "1").await, (20, 20));
    assert_eq!(t.rows("shard_2", "1").await, (0, 0));
    assert_eq!(t.placement("2").await, "shard_2");
    let status = succeeded(&cli(&t, &["batch", "status", &batch]).await);
    assert!(
        status.contains(&format!("batch {batch} running")),
        "{status}"
    );
    assert!(
        status.contains(&format!(
            "tenant/1 shard_1 -> shard_2: aborted (move {move_id})"
        )),
        "{status}"
    );

    // A failed move is tried again by the next run.
    let out = succeeded(&cli(&t, &["batch", "resume", &batch]).await);
    assert!(out.contains("tenant/1 shard_1 -> shard_2: moved"), "{out}");
    assert!(out.contains("tenant/2 is on shard_2 already"), "{out}");
    let status = succeeded(&cli(&t, &["batch", "status", &batch]).await);
    assert!(status.contains(&format!("batch {batch} done")), "{status}");
    assert_eq!(t.rows("shard_2", "1").await, (20, 20));
    std::fs::remove_file(&plan).unwrap();
}

/// A runner whose directory restarted finds, once connected again, another runner holding its
/// batch: it starts no move and says who holds it (exit 4); the other runner finishes the batch.
#[tokio::test]
async fn a_runner_that_finds_its_batch_taken_after_a_restart_starts_nothing() {
    let t = Topology::start("batch-taken").await;
    for id in ["1", "2"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 20, 1).await;
    }
    let plan = plan_file(&t, "taken", &["1", "2"]);
    // The first runner is held at its first read of the batch's state, before any move.
    let polling = Held::new("taken-poll");
    let mut first = command(&t)
        .args([
            "move",
            "--from-file",
            plan.to_str().unwrap(),
            "--method",
            "copy",
        ])
        .env("FAILPOINTS", polling.at("batch.poll"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    reached(&polling, &mut first).await;
    let batch = last_batch(&t).await.to_string();
    t.directory.stop();
    t.directory.restart();
    // Meanwhile another runner takes the batch, and is held in its first move's freeze.
    let copying = Held::new("taken-copy");
    let mut second = command(&t)
        .args(["batch", "resume", &batch])
        .env("FAILPOINTS", copying.at("copy.commit.Copy"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    reached(&copying, &mut second).await;

    polling.release();
    let out = tokio::time::timeout(MINUTE, first.wait_with_output())
        .await
        .expect("the first runner stops")
        .unwrap();
    let (report, said) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{report}{said}");
    assert_eq!(
        report
            .matches(": not started (the runner stopped first)")
            .count(),
        2,
        "{report}"
    );
    assert!(
        said.contains(&format!("batch {batch} is being run by another process")),
        "{said}"
    );
    let open: i64 = t
        .step("SELECT count(*) FROM shard_directory.shard_moves")
        .await;
    assert_eq!(open, 1, "only the second runner's move began");

    copying.release();
    let out = tokio::time::timeout(MINUTE, second.wait_with_output())
        .await
        .expect("the second runner ends")
        .unwrap();
    let report = succeeded(&out);
    assert_eq!(report.matches(": moved").count(), 2, "{report}");
    let status = succeeded(&cli(&t, &["batch", "status", &batch]).await);
    assert!(status.contains(&format!("batch {batch} done")), "{status}");
    std::fs::remove_file(&plan).unwrap();
}
