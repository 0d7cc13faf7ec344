//! The proof that no write is lost while tenants move. Eight writers route through four client
//! instances (two of them deaf: no LISTEN, an hour between polls, so they learn of moves only
//! from the shards' refusals) and insert uniquely numbered orders for six tenants over three
//! shards, while moves run back and forth with both methods and one mover process is killed
//! (SIGKILL) at a random phase, then resumed or aborted with the CLI. At the end every
//! acknowledged order exists exactly once, on the shard the directory names; no order exists
//! anywhere else; nothing unacknowledged is duplicated.
//!
//! `PROOF_SEED=<n>` replays a run's random choices (each run prints its seed).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shard_directory_client::{DirectoryConfig, EntityKey, Router};
use shard_directory_e2e::{cli_binary, Topology};
use shard_directory_mover::{Method, MethodChoice, MoveOptions, Phase};
use tokio::sync::watch;

const TENANTS: [&str; 6] = ["t1", "t2", "t3", "t4", "t5", "t6"];
const WRITERS: usize = 8;
const MOVES: usize = 24;
const SEEDED: i64 = 200;

#[derive(Default)]
struct Ledger {
    /// item -> tenant, for every acknowledged order.
    acked: HashMap<String, String>,
    /// item -> tenant, for every order whose transaction returned an error.
    unacked: HashMap<String, String>,
    errors: BTreeMap<String, u64>,
}

async fn write_one(
    router: &Router,
    tenant: &str,
    item: &str,
) -> Result<(), shard_directory_client::Error> {
    router
        .run(&EntityKey::new("tenant", tenant), async |tx| {
            let order: i64 = tx
                .query_one(
                    "INSERT INTO orders (tenant_id, item) VALUES ($1, $2) RETURNING order_id",
                    &[&tenant, &item],
                )
                .await?
                .get(0);
            tx.execute(
                "INSERT INTO order_lines (tenant_id, order_id, line_no, product) VALUES ($1, $2, 1, $3)",
                &[&tenant, &order, &item],
            )
            .await?;
            Ok(())
        })
        .await
}

async fn writer(
    router: Arc<Router>,
    ledger: Arc<Mutex<Ledger>>,
    seq: Arc<AtomicU64>,
    w: usize,
    seed: u64,
    stop: watch::Receiver<bool>,
) {
    let mut rng = fastrand::Rng::with_seed(seed ^ (w as u64 + 1));
    while !*stop.borrow() {
        let tenant = TENANTS[rng.usize(..TENANTS.len())];
        let item = format!("w{w}-{}", seq.fetch_add(1, Ordering::Relaxed));
        let result = write_one(&router, tenant, &item).await;
        {
            let mut ledger = ledger.lock().unwrap();
            match result {
                Ok(()) => {
                    ledger.acked.insert(item, tenant.to_owned());
                }
                Err(e) => {
                    assert!(
                        e.is_retryable(),
                        "only retryable errors while tenants move: {e:?}"
                    );
                    let kind = format!("{e:?}")
                        .split([' ', '(', '{'])
                        .next()
                        .unwrap_or("?")
                        .to_owned();
                    *ledger.errors.entry(kind).or_default() += 1;
                    ledger.unacked.insert(item, tenant.to_owned());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

async fn placement(t: &Topology, tenant: &str) -> String {
    t.dba()
        .await
        .query_one(
            "SELECT shard_name FROM shard_directory.shard_directory WHERE entity_type = 'tenant' AND entity_id = $1",
            &[&tenant],
        )
        .await
        .unwrap()
        .get(0)
}

/// The phase of the tenant's open move, if any.
async fn open_phase(t: &Topology, tenant: &str) -> Option<(i64, Phase)> {
    t.dba()
        .await
        .query_opt(
            "SELECT move_id, phase FROM shard_directory.shard_moves WHERE entity_id = $1 AND finished_at IS NULL",
            &[&tenant],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), Phase::parse(r.get(1)).unwrap()))
}

fn cli(t: &Topology) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(cli_binary());
    c.env("SHARD_DIRECTORY_URL", t.directory.conn_str("directory"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

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
    let mut child = cli(t)
        .args(["move", "tenant", tenant, "--to", to, "--method", method])
        .kill_on_drop(true)
        .spawn()
        .expect("run shard-directory move");
    let started = Instant::now();
    let (move_id, killed_at) = loop {
        if let Some((id, phase)) = open_phase(t, tenant).await {
            if phase >= kill_at {
                child.kill().await.expect("SIGKILL the mover");
                break (id, phase);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "the CLI move failed: {:?}",
                child.wait_with_output().await
            );
            return None;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the CLI move did not reach {kill_at}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    // The mover may have gone on between the phase read and the kill (past its cutover, or to
    // the end): what to do next is decided by where it really stopped.
    let Some((_, stopped_at)) = open_phase(t, tenant).await else {
        return Some(format!(
            "move {move_id} ({method}) finished before the kill aimed at {kill_at} landed"
        ));
    };
    let verb = if abort && stopped_at.can_abort() {
        "abort"
    } else {
        "resume"
    };
    let out = cli(t)
        .args([verb, &move_id.to_string()])
        .output()
        .await
        .expect("run shard-directory resume/abort");
    assert!(
        out.status.success(),
        "shard-directory {verb} {move_id} after a kill at {stopped_at}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(format!(
        "move {move_id} ({method}) killed at {stopped_at} (seen at {killed_at}, aimed at {kill_at}), then `shard-directory {verb}`"
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
    for (i, tenant) in TENANTS.iter().enumerate() {
        let shard = format!("shard_{}", i % 3 + 1);
        t.add_tenant(tenant, &shard).await;
        let version = t.step("SELECT shard_directory.current_version()").await;
        t.shard(&shard)
            .await
            .batch_execute(&format!(
                "BEGIN; SELECT set_config('app.directory_version', '{version}', true);
                 INSERT INTO orders (tenant_id, item) SELECT '{tenant}', 'seed-{tenant}-' || g FROM generate_series(1, {SEEDED}) g;
                 INSERT INTO order_lines (tenant_id, order_id, line_no, product)
                 SELECT tenant_id, order_id, 1, item FROM orders WHERE tenant_id = '{tenant}';
                 COMMIT"
            ))
            .await
            .unwrap();
    }
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    for tenant in TENANTS {
        for g in 1..=SEEDED {
            ledger
                .lock()
                .unwrap()
                .acked
                .insert(format!("seed-{tenant}-{g}"), tenant.to_owned());
        }
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
    let (stop, stopped) = watch::channel(false);
    let seq = Arc::new(AtomicU64::new(0));
    // Writers and moves run concurrently in this task (the router's closures are not Send).
    let writers = futures_util::future::join_all((0..WRITERS).map(|w| {
        writer(
            routers[w % 4].clone(),
            ledger.clone(),
            seq.clone(),
            w,
            seed,
            stopped.clone(),
        )
    }));
    let moves = async {
        let started = Instant::now();
        let mut by_method: BTreeMap<&str, u32> = BTreeMap::new();
        let mut max_freeze = Duration::ZERO;
        let mut kill_report = None;
        let kill_move = rng.usize(4..MOVES - 4);
        let mut m = 0;
        while m < MOVES || kill_report.is_none() {
            let tenant = TENANTS[rng.usize(..TENANTS.len())];
            let from = placement(&t, tenant).await;
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
        let moving = started.elapsed();
        stop.send(true).unwrap();
        (m, moving, by_method, max_freeze, kill_report)
    };
    let (_, (m, moving, by_method, max_freeze, kill_report)) = tokio::join!(writers, moves);

    // Where every order is.
    let mut placements = HashMap::new();
    for tenant in TENANTS {
        placements.insert(tenant, placement(&t, tenant).await);
    }
    let mut seen: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut misplaced = Vec::new();
    for (shard, _) in &t.shards {
        let c = t.shard(shard).await;
        for r in c
            .query(
                "SELECT o.tenant_id, o.item, count(l.*) FROM orders o
                 LEFT JOIN order_lines l USING (tenant_id, order_id) GROUP BY 1, 2",
                &[],
            )
            .await
            .unwrap()
        {
            let (tenant, item, lines): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
            assert_eq!(lines, 1, "order {item} has its line");
            if placements[tenant.as_str()] != *shard {
                misplaced.push(format!("{item} of {tenant} on {shard}"));
            }
            seen.entry(item).or_default().push((tenant, shard.clone()));
        }
    }
    let ledger = ledger.lock().unwrap();
    let lost: Vec<_> = ledger
        .acked
        .keys()
        .filter(|i| !seen.contains_key(*i))
        .take(20)
        .collect();
    let duplicated: Vec<_> = seen
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(i, at)| format!("{i}: {at:?}"))
        .take(20)
        .collect();
    let unknown: Vec<_> = seen
        .keys()
        .filter(|i| !ledger.acked.contains_key(*i) && !ledger.unacked.contains_key(*i))
        .take(20)
        .collect();
    let unacked_landed = ledger
        .unacked
        .keys()
        .filter(|i| seen.contains_key(*i))
        .count();

    let mut retries: BTreeMap<String, u64> = BTreeMap::new();
    for r in &routers {
        for (reason, n) in r.directory().stats().rejections {
            *retries.entry(reason).or_default() += n;
        }
    }
    println!(
        "proof: {} orders acked ({} seeded), {} unacked ({unacked_landed} of them committed all the same), \
         errors {:?}; shard rejections retried by reason {retries:?}; {m} moves in {moving:?} {by_method:?}, \
         max freeze {max_freeze:?}; {}",
        ledger.acked.len(),
        SEEDED * TENANTS.len() as i64,
        ledger.unacked.len(),
        ledger.errors,
        kill_report.as_deref().unwrap_or("no kill")
    );
    assert!(lost.is_empty(), "acknowledged orders lost: {lost:?}");
    assert!(duplicated.is_empty(), "orders stored twice: {duplicated:?}");
    assert!(
        misplaced.is_empty(),
        "orders on a shard the directory does not name: {:?}",
        &misplaced[..misplaced.len().min(20)]
    );
    assert!(unknown.is_empty(), "orders nobody wrote: {unknown:?}");
    assert!(
        ledger.acked.len() as i64 > SEEDED * TENANTS.len() as i64 + 1000,
        "the writers kept writing"
    );
    assert!(
        retries.values().sum::<u64>() > 0,
        "moves made shards refuse stale routes"
    );
}
