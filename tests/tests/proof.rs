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
use shard_directory_e2e::workload::{refusals, Audit, Ledger, Workload};
use shard_directory_e2e::{mover_cli, Topology};
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
    abort: bool,
) -> Option<String> {
    let killed = mover_cli::kill_at(t, tenant, to, method, kill_at).await?;
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
        "move {move_id} ({method}) killed at {stopped_at} (seen at {}, aimed at {kill_at}), then `shard-directory {verb}`",
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
                kill_report = killed_move(&t, tenant, &to, by.as_str(), kill_at, rng.bool()).await;
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
