//! The proof that no write is lost while tenants move. Eight writers route through four client
//! instances (two of them deaf: no LISTEN, an hour between polls, so they learn of moves only
//! from the shards' refusals) and insert uniquely numbered orders for six tenants over three
//! shards, while moves run back and forth with both methods and one mover process is killed
//! (SIGKILL) at a random phase, then resumed or aborted with the CLI. At the end every
//! acknowledged order exists exactly once, on the shard the directory names; no order exists
//! anywhere else; nothing unacknowledged is duplicated.
//!
//! `PROOF_SEED=<n>` replays a run's random choices (each run prints its seed).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_client::{DirectoryConfig, EntityKey};
use shard_directory_e2e::workload::{refusals, Audit, Ledger, Workload, Writes};
use shard_directory_e2e::{mover_cli, wide, Topology};
use shard_directory_mover::{Method, MethodChoice, MoveOptions, Phase};

const TENANTS: [&str; 6] = ["t1", "t2", "t3", "t4", "t5", "t6"];
const WRITERS_PER_INSTANCE: usize = 2;
const MOVES: usize = 24;
const SEEDED: i64 = 200;

/// Moves `tenant` with the CLI and SIGKILLs the process once its move reaches `kill_at` (or
/// later); then resumes or aborts it with the CLI. Returns what happened, or None when the move
/// finished before the kill.
async fn killed_move(
    t: &Topology,
    tenant: &str,
    to: &str,
    method: &str,
    kill_at: Phase,
    delay: Duration,
    abort: bool,
) -> Option<String> {
    let killed = mover_cli::kill_at(t, tenant, to, method, kill_at, delay).await?;
    let move_id = killed.move_id;
    // What to do next is decided by where the move really stopped.
    let Some(stopped_at) = killed.stopped_at else {
        return Some(format!(
            "move {move_id} ({method}) finished before the kill aimed at {kill_at} landed"
        ));
    };
    let verb = if abort && stopped_at.can_abort() {
        "abort"
    } else {
        "resume"
    };
    mover_cli::finish(t, verb, move_id).await;
    Some(format!(
        "move {move_id} ({method}) killed at {stopped_at} (seen at {}, aimed at {kill_at} + {delay:?}), then `shard-directory {verb}`",
        killed.seen_at
    ))
}

#[tokio::test]
async fn no_acknowledged_write_is_lost_or_duplicated_while_tenants_move() {
    let seed = std::env::var("PROOF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("PROOF_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let t = Topology::with_shards("proof", 3).await;
    let mut ledger = Ledger::default();
    for (i, tenant) in TENANTS.iter().enumerate() {
        let shard = format!("shard_{}", i % 3 + 1);
        t.add_tenant(tenant, &shard).await;
        for item in t.seed_orders(&shard, tenant, SEEDED, 1).await {
            ledger.acked.insert(item, tenant.to_string());
        }
    }
    let seeded = ledger.acked.len();

    let mut routers = Vec::new();
    for i in 0..4 {
        let config = if i < 2 {
            DirectoryConfig::default()
        } else {
            DirectoryConfig::default()
                .listen(false)
                .poll_interval(Duration::from_secs(3600))
        };
        routers.push(Arc::new(t.router(t.client_directory(config).await)));
    }
    let workload = Workload::start(
        &routers,
        &TENANTS,
        WRITERS_PER_INSTANCE,
        Duration::from_millis(3),
        seed,
        ledger,
    );
    let (m, moving, by_method, max_freeze, kill_report) = {
        let started = Instant::now();
        let mut by_method: BTreeMap<&str, u32> = BTreeMap::new();
        let mut max_freeze = Duration::ZERO;
        let mut kill_report = None;
        let kill_move = rng.usize(4..MOVES - 4);
        let mut m = 0;
        while m < MOVES || kill_report.is_none() {
            let tenant = TENANTS[rng.usize(..TENANTS.len())];
            let from = t.placement(tenant).await;
            let to = loop {
                let s = format!("shard_{}", rng.usize(1..=3));
                if s != from {
                    break s;
                }
            };
            let method = if m % 2 == 0 {
                MethodChoice::Logical
            } else {
                MethodChoice::Copy
            };
            if m >= kill_move && kill_report.is_none() {
                let by = if method == MethodChoice::Copy {
                    Method::Copy
                } else {
                    Method::Logical
                };
                let phases = &by.phases()[..by.phases().len() - 1]; // all but done
                let kill_at = phases[rng.usize(..phases.len())];
                let delay = Duration::from_millis(rng.u64(0..200));
                kill_report =
                    killed_move(&t, tenant, &to, by.as_str(), kill_at, delay, rng.bool()).await;
                *by_method.entry("cli").or_default() += 1;
            } else {
                let record = t
                    .mover(MoveOptions {
                        method,
                        ..Default::default()
                    })
                    .start(&EntityKey::new("tenant", tenant), &to)
                    .await
                    .unwrap_or_else(|e| panic!("move {m} of {tenant} {from} -> {to}: {e}"));
                *by_method
                    .entry(if record.method == Method::Logical {
                        "logical"
                    } else {
                        "copy"
                    })
                    .or_default() += 1;
                max_freeze = max_freeze.max(record.freeze_time().unwrap_or_default());
            }
            m += 1;
        }
        (m, started.elapsed(), by_method, max_freeze, kill_report)
    };
    let ledger = workload.stop().await;
    let audit = Audit::of(&t, &ledger).await;

    let retries = refusals(&routers);
    println!(
        "proof: {} orders acked ({seeded} seeded), {} unacked ({} of them committed all the same), \
         errors {:?}; shard rejections retried by reason {retries:?}; {m} moves in {moving:?} {by_method:?}, \
         max freeze {max_freeze:?}; {}",
        ledger.acked.len(),
        ledger.unacked.len(),
        audit.unacked_landed,
        ledger.failed,
        kill_report.as_deref().unwrap_or("no kill")
    );
    assert!(audit.holds(), "{}", audit.problems());
    assert!(
        ledger.fatal.is_empty(),
        "only retryable errors while tenants move: {:?}",
        ledger.fatal
    );
    assert!(
        ledger.acked.len() > seeded + 1000,
        "the writers kept writing"
    );
    assert!(
        retries.values().sum::<u64>() > 0,
        "moves made shards refuse stale routes"
    );
}

const ACCOUNTS: [&str; 3] = ["101", "102", "103"];
const DEVICES: [&str; 3] = [
    "00000000-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000002",
    "00000000-0000-4000-8000-000000000003",
];
const WIDE_MOVES: usize = 14;

/// Runs a move to its end however it stopped: resumed (or its abort finished) until its record
/// is final, while a shard it needs may still be coming back.
async fn finish_move(t: &Topology, move_id: i64) -> Phase {
    let mover = t.mover(MoveOptions::default());
    let started = Instant::now();
    loop {
        let phase = mover
            .status(move_id)
            .await
            .expect("the move's record")
            .phase;
        if phase.is_finished() {
            return phase;
        }
        match mover.resume(move_id).await {
            Ok(record) => return record.phase,
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "move {move_id} did not finish: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The wider proof: entities keyed by bigint (accounts: an invoice chain with cascades, a
/// self-referencing folder tree, timestamptz/date/float/jsonb/bytea/enum[] columns, a sequence
/// no column owns) and by uuid (devices), on shards whose TimeZone, DateStyle, IntervalStyle and
/// extra_float_digits differ; copy moves run as a role holding exactly the documented grants; one
/// CLI mover is killed at a random point inside a random phase, and one shard is restarted in
/// the middle of another move. Every acknowledged write ends up once, where the directory says.
#[tokio::test]
async fn no_acknowledged_write_is_lost_on_a_wide_schema_with_kills_inside_phases_and_a_restart() {
    let seed = std::env::var("PROOF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("PROOF_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let t = Topology::configured(
        "proof-wide",
        &[
            &[],
            &[("TimeZone", "Asia/Kathmandu"), ("DateStyle", "German, DMY")],
            &[
                ("TimeZone", "America/Los_Angeles"),
                ("DateStyle", "SQL, MDY"),
                ("IntervalStyle", "sql_standard"),
                ("extra_float_digits", "0"),
            ],
        ],
    )
    .await;
    for (name, _) in &t.shards {
        t.shard(name)
            .await
            .batch_execute(wide::SCHEMA)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    t.create_mover_role().await;
    t.grant_mover_as_readme_lists(
        &format!("public.orders, public.order_lines, {}", wide::TABLES),
        &format!("public.orders_order_id_seq, {}", wide::SEQUENCES),
    )
    .await;
    let entities: Vec<EntityKey> = ACCOUNTS
        .iter()
        .map(|a| EntityKey::new("account", *a))
        .chain(DEVICES.iter().map(|d| EntityKey::new("device", *d)))
        .collect();
    for (i, key) in entities.iter().enumerate() {
        let shard = format!("shard_{}", i % 3 + 1);
        t.add_entity(&key.entity_type, &key.entity_id, &shard).await;
        t.write_as_client(&shard, &wide::create_sql(key))
            .await
            .unwrap();
    }
    let mut routers = Vec::new();
    for i in 0..4 {
        let config = if i < 2 {
            DirectoryConfig::default()
        } else {
            DirectoryConfig::default()
                .listen(false)
                .poll_interval(Duration::from_secs(3600))
        };
        routers.push(Arc::new(t.router(t.client_directory(config).await)));
    }
    let writes: [Arc<dyn Writes>; 2] = [Arc::new(wide::Invoices), Arc::new(wide::Readings)];
    let ids: [&[&str]; 2] = [&ACCOUNTS, &DEVICES];
    let mut workloads = Vec::new();
    for (w, ids) in writes.iter().zip(ids) {
        let mut ledger = Ledger::default();
        for id in ids {
            for n in 0..20 {
                let item = format!("seed {id} {n}");
                w.write(&routers[0], id, &item).await.expect("seed");
                ledger.acked.insert(item, id.to_string());
            }
        }
        workloads.push(Workload::start_with(
            w.clone(),
            &routers,
            ids,
            1,
            Duration::from_millis(3),
            rng.u64(..),
            ledger,
        ));
    }
    let copy_as_mover = t.mover_as_role(
        MoveOptions {
            method: MethodChoice::Copy,
            ..Default::default()
        },
        None,
    );
    let logical = t.mover(MoveOptions {
        method: MethodChoice::Logical,
        ..Default::default()
    });
    let (kill_move, restart_move) = (rng.usize(2..6), rng.usize(7..WIDE_MOVES - 1));
    let mut report = Vec::new();
    let started = Instant::now();
    for m in 0..WIDE_MOVES {
        let key = &entities[rng.usize(..entities.len())];
        let from = t.entry(&key.entity_type, &key.entity_id).await.0;
        let to = loop {
            let s = format!("shard_{}", rng.usize(1..=3));
            if s != from {
                break s;
            }
        };
        let method = if m % 2 == 0 { "logical" } else { "copy" };
        if m == kill_move {
            let by = if method == "copy" {
                Method::Copy
            } else {
                Method::Logical
            };
            let phases = &by.phases()[..by.phases().len() - 1];
            let kill_at = phases[rng.usize(..phases.len())];
            let delay = Duration::from_millis(rng.u64(0..150));
            let mut c = mover_cli::command(&t);
            c.args([
                "move",
                &key.entity_type,
                &key.entity_id,
                "--to",
                &to,
                "--method",
                method,
            ])
            .kill_on_drop(true);
            let mut child = c.spawn().unwrap();
            let id = loop {
                let open = t
                    .dba()
                    .await
                    .query_opt(
                        "SELECT move_id, phase FROM shard_directory.shard_moves WHERE finished_at IS NULL",
                        &[],
                    )
                    .await
                    .unwrap()
                    .map(|r| (r.get::<_, i64>(0), Phase::parse(r.get(1)).unwrap()));
                if let Some((id, phase)) = open.filter(|(_, p)| *p >= kill_at) {
                    tokio::time::sleep(delay).await;
                    child.kill().await.unwrap();
                    report.push(format!(
                        "move {id} ({method}) of {key} {from} -> {to} SIGKILLed {delay:?} into {phase} \
                         (aimed at {kill_at})"
                    ));
                    break Some(id);
                }
                if child.try_wait().unwrap().is_some() {
                    report.push(format!("the CLI move finished before {kill_at}"));
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            if let Some(id) = id {
                let phase = finish_move(&t, id).await;
                report.push(format!("move {id} then {phase}"));
            }
            continue;
        }
        let mover = if method == "copy" {
            &copy_as_mover
        } else {
            &logical
        };
        if m == restart_move {
            let bounce = if rng.bool() { from.clone() } else { to.clone() };
            let delay = Duration::from_millis(rng.u64(20..400));
            let moving = mover.start(key, &to);
            let restart = async {
                tokio::time::sleep(delay).await;
                let cluster = t.shard_cluster(&bounce);
                cluster.stop();
                cluster.restart();
            };
            let (result, ()) = tokio::join!(moving, restart);
            let phase = match result {
                Ok(record) => record.phase,
                Err(f) => match f.move_id {
                    Some(id) => finish_move(&t, id).await,
                    None => Phase::Aborted,
                },
            };
            report.push(format!(
                "move {m} ({method}) of {key}: {bounce} restarted {delay:?} in, then {phase}"
            ));
            continue;
        }
        let record = mover.start(key, &to).await.unwrap_or_else(|e| {
            panic!(
                "move {m} of {key} {from} -> {to} by {method}: {e}\nbefore it: {}",
                report.join("; ")
            )
        });
        assert_eq!(record.phase, Phase::Done);
    }
    let moving = started.elapsed();
    let mut ledgers = Vec::new();
    for w in workloads {
        ledgers.push(w.stop().await);
    }
    for (w, ledger) in writes.iter().zip(&ledgers) {
        let audit = Audit::of_with(&t, ledger, w.as_ref()).await;
        println!(
            "proof (wide, {}): {} acked, {} unacked ({} committed all the same), errors {:?}",
            w.entity_type(),
            ledger.acked.len(),
            ledger.unacked.len(),
            audit.unacked_landed,
            ledger.failed
        );
        assert!(audit.holds(), "{}: {}", w.entity_type(), audit.problems());
        // A commit cut off by the restart has an unknown outcome: the only error the
        // application may not retry.
        let fatal: Vec<_> = ledger
            .fatal
            .iter()
            .filter(|e| !e.contains("step: \"commit\""))
            .collect();
        assert!(fatal.is_empty(), "only retryable errors: {fatal:?}");
        assert!(ledger.acked.len() > 60 + 100, "the writers kept writing");
    }
    println!(
        "proof (wide): {WIDE_MOVES} moves in {moving:?}; shard rejections retried by reason {:?}; {}",
        refusals(&routers),
        report.join("; ")
    );
}
