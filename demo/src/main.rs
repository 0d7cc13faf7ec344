//! The main job: the guide's "Verification", performed for real against throwaway clusters.
//!
//! A directory and three shards; four application instances, each with its own `Directory`,
//! `Router` and `/debug/directory` port, write orders (with their lines) and read them back for
//! four tenants. While they do, the mover moves tenant 8842 with its rows; every instance's
//! version converges; a deliberately stale instance is refused with 40001 and retries onto the
//! right shard; the guide's bare re-point is refused and history says where 8842 was; the
//! directory is stopped, and the instances serve active tenants from cache while a tenant mid-move
//! fails closed. It ends with a summary, removes every cluster (also on Ctrl-C), and exits
//! non-zero when any claim it printed did not hold.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use serde_json::Value;
use shard_directory_client::{Directory, DirectoryConfig, EntityKey, Router};
use shard_directory_e2e::workload::{refusals, Audit, Ledger, Workload};
use shard_directory_e2e::{within, Topology};
use shard_directory_mover::{MethodChoice, MoveOptions, Mover, Observer, Phase};
use stale::StaleInstance;
use tokio::sync::Notify;

mod stale;

const TENANTS: [&str; 4] = ["8842", "17", "23", "101"];
const HOMES: [&str; 4] = ["shard_1", "shard_2", "shard_3", "shard_1"];
/// Orders of 8842 before the demo starts, so that the move has rows to carry.
const SEEDED: i64 = 20_000;
const INSTANCES: usize = 4;
const WRITERS_PER_INSTANCE: usize = 2;
const PAUSE: Duration = Duration::from_millis(20);
/// How long anything the demo waits for may take before it counts as not held.
const DEADLINE: Duration = Duration::from_secs(20);

/// The claims the demo prints, and which did not hold.
#[derive(Default)]
struct Claims(Vec<String>);

impl Claims {
    fn check(&mut self, held: bool, claim: impl Into<String>) {
        let claim = claim.into();
        if held {
            println!("   ok: {claim}");
        } else {
            println!("   NOT HELD: {claim}");
            self.0.push(claim);
        }
    }
}

/// One application instance: its own directory client, router and debug endpoint, and when it
/// learned each version.
struct Instance {
    name: String,
    router: Arc<Router>,
    debug: SocketAddr,
    learned: Arc<Mutex<Vec<(i64, SystemTime)>>>,
}

impl Instance {
    async fn start(t: &Topology, name: &str) -> Instance {
        let directory = t.client_directory(DirectoryConfig::default()).await;
        let (debug, _) = shard_directory_client::debug_http::serve(
            directory.clone(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .expect("serve /debug/directory");
        let learned = Arc::new(Mutex::new(vec![(directory.version(), SystemTime::now())]));
        let mut changes = directory.version_changes();
        let log = learned.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let v = *changes.borrow_and_update();
                log.lock().unwrap().push((v, SystemTime::now()));
            }
        });
        Instance {
            name: name.to_owned(),
            router: Arc::new(t.router(directory)),
            debug,
            learned,
        }
    }

    fn directory(&self) -> &Directory {
        self.router.directory()
    }

    /// `curl -s <debug>/debug/directory`, as the guide checks each pod.
    async fn debug_view(&self) -> Value {
        serde_json::from_slice(&curl(&format!("http://{}/debug/directory", self.debug)).await)
            .unwrap_or(Value::Null)
    }

    /// When this instance first knew `version` or a later one.
    fn learned_at(&self, version: i64) -> Option<SystemTime> {
        let log = self.learned.lock().unwrap();
        log.iter().find(|(v, _)| *v >= version).map(|(_, at)| *at)
    }
}

/// `curl -s <url>`: the body, empty when nothing answered within 5 s.
async fn curl(url: &str) -> Vec<u8> {
    tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "5", url])
        .output()
        .await
        .expect("run curl")
        .stdout
}

/// Prints each phase of a move with the time since it started, and each table as it completes;
/// notes when the cutover was reported; holds the move at `hold_at` until released.
struct Progress {
    started: Instant,
    /// Tables whose rows are all copied: said once.
    copied: Mutex<Vec<String>>,
    hold_at: Option<Phase>,
    held: Notify,
    release: Notify,
}

impl Progress {
    fn new(hold_at: Option<Phase>) -> Arc<Progress> {
        Arc::new(Progress {
            started: Instant::now(),
            copied: Mutex::default(),
            hold_at,
            held: Notify::new(),
            release: Notify::new(),
        })
    }
}

impl Observer for Progress {
    fn phase(&self, move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        println!(
            "   mover  +{:>6.1} ms  move {move_id}: {phase}",
            self.started.elapsed().as_secs_f64() * 1e3
        );
        Box::pin(async move {
            if self.hold_at == Some(phase) {
                self.held.notify_one();
                self.release.notified().await;
            }
        })
    }

    fn rows(&self, move_id: i64, table: &str, done: i64, total: i64) {
        let mut copied = self.copied.lock().unwrap();
        if done == total && !copied.iter().any(|t| t == table) {
            copied.push(table.to_owned());
            println!(
                "   mover  +{:>6.1} ms  move {move_id}: {table}: {done} of {total} rows",
                self.started.elapsed().as_secs_f64() * 1e3
            );
        }
    }

    fn note(&self, move_id: i64, message: &str) {
        println!("   mover  move {move_id}: {message}");
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// `(orders, order_lines)` of `tenant` on each shard.
async fn rows_per_shard(t: &Topology, tenant: &str) -> Vec<(String, i64, i64)> {
    let mut out = Vec::new();
    for (shard, _) in &t.shards {
        let (orders, lines) = t.rows(shard, tenant).await;
        out.push((shard.clone(), orders, lines));
    }
    out
}

fn print_rows(title: &str, rows: &[(String, i64, i64)]) {
    let cells: Vec<String> = rows
        .iter()
        .map(|(s, o, l)| format!("{s}: {o} orders, {l} lines"))
        .collect();
    println!("   {title}: {}", cells.join(" | "));
}

/// When the directory committed `version`, from its commit timestamp.
async fn committed_at(t: &Topology, version: i64) -> SystemTime {
    let micros: i64 = t
        .dba()
        .await
        .query_one(
            "SELECT (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1e6)::int8
             FROM shard_directory.shard_directory_history WHERE version = $1 LIMIT 1",
            &[&version],
        )
        .await
        .expect("the commit timestamp of a version")
        .get(0);
    UNIX_EPOCH + Duration::from_micros(micros as u64)
}

/// Prints every instance's `/debug/directory` version and when it knew `version` after its
/// commit; returns whether all knew it within a second (the guide's "within a second" for every instance).
async fn converged(t: &Topology, instances: &[Instance], version: i64) -> bool {
    let commit = committed_at(t, version).await;
    let mut all = true;
    for i in instances {
        let at = within(DEADLINE, || async { i.learned_at(version) }).await;
        let view = i.debug_view().await;
        let took = at.map(|at| at.duration_since(commit).unwrap_or_default());
        println!(
            "   $ curl -s {}/debug/directory | jq .version   # {}: {}   {}",
            i.debug,
            i.name,
            view["version"],
            took.map_or("never knew it".to_owned(), |d| format!(
                "knew it {} after the commit",
                ms(d)
            ))
        );
        all &= took.is_some_and(|d| d < Duration::from_secs(1));
    }
    all
}

/// Moves `tenant` to `to` with the mover (logical: copy, then stream; writes refused only for
/// the final catch-up), printing its progress.
/// A mover that moves by logical replication (copy, then stream; writes refused only for the
/// final catch-up) and reports to `progress`.
fn logical_mover(t: &Topology, progress: Arc<Progress>) -> Mover {
    let options = MoveOptions {
        method: MethodChoice::Logical,
        ..Default::default()
    };
    t.mover(options).with_observer(progress)
}

/// The demo's clusters, application instances and workload, and the claims it has checked; one
/// method per step of the guide's verification.
struct Demo {
    t: Topology,
    claims: Claims,
    instances: Vec<Instance>,
    routers: Vec<Arc<Router>>,
    workload: Workload,
    /// A fifth instance, deliberately stale, in its own process (its own /metrics).
    stale: StaleInstance,
    /// The stale instance's orders, audited with the workload's.
    extra: Ledger,
    /// Orders of 8842 there before the workload began.
    seeded: usize,
}

/// What the move of step 1 did.
struct Moved {
    started: SystemTime,
    cutover: i64,
    freeze: Duration,
}

impl Demo {
    /// Clusters, tenants, instances, the workload and the stale instance.
    async fn start() -> Demo {
        println!("== starting throwaway clusters: a directory and three shards (PostgreSQL 15, the extension everywhere)");
        let t = Topology::with_shards("demo", 3).await;
        println!(
            "   directory on 127.0.0.1:{}; {}",
            t.directory.port(),
            t.shards
                .iter()
                .map(|(n, c)| format!("{n} on :{}", c.port()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut ledger = Ledger::default();
        for (tenant, home) in TENANTS.iter().zip(HOMES) {
            t.add_tenant(tenant, home).await;
        }
        for item in t.seed_orders("shard_1", "8842", SEEDED, 1).await {
            ledger.acked.insert(item, "8842".into());
        }
        let seeded = ledger.acked.len();
        println!(
            "   tenants {} on {} (orders and order_lines protected on every shard); {SEEDED} orders of 8842 already there",
            TENANTS.join(", "),
            HOMES.join(", ")
        );

        println!("\n== {INSTANCES} application instances, each with its own Directory, Router and /debug/directory");
        let mut instances = Vec::new();
        for n in 1..=INSTANCES {
            let i = Instance::start(&t, &format!("app-{n}")).await;
            println!("   {} at http://{}/debug/directory", i.name, i.debug);
            instances.push(i);
        }
        let routers: Vec<Arc<Router>> = instances.iter().map(|i| i.router.clone()).collect();
        let workload = Workload::start(
            &routers,
            &TENANTS,
            WRITERS_PER_INSTANCE,
            PAUSE,
            fastrand::u64(..),
            ledger,
        );
        println!(
            "   workload: {} writers, each an order with its line then a read, every {PAUSE:?}, over tenants {}",
            INSTANCES * WRITERS_PER_INSTANCE,
            TENANTS.join(", ")
        );
        // A fifth instance, deliberately stale, in its own process (its own /metrics).
        let mut stale = StaleInstance::start(&t, "8842").await;
        let mut extra = Ledger::default();
        extra.acked.insert("stale-1".into(), "8842".into());
        let route = stale.ask("route 8842").await;
        println!(
            "   app-stale (its own process: no LISTEN, hourly poll) at http://{}/debug/directory and \
             http://{}/metrics wrote an order of 8842 ({route})",
            stale.debug, stale.metrics
        );
        Demo {
            t,
            claims: Claims::default(),
            instances,
            routers,
            workload,
            stale,
            extra,
            seeded,
        }
    }

    /// Step 1: tenant 8842 moved by the mover under load.
    async fn move_under_load(&mut self) -> Option<Moved> {
        let Demo { t, claims, .. } = self;
        println!("\n== 1. move tenant 8842 from shard_1 to shard_3 with the mover, under load");
        print_rows("8842 before", &rows_per_shard(t, "8842").await);
        let before_move = SystemTime::now();
        let moved = logical_mover(t, Progress::new(None))
            .start(&EntityKey::new("tenant", "8842"), "shard_3")
            .await;
        let record = match moved {
            Ok(r) => r,
            Err(e) => {
                claims.check(false, format!("the move of 8842 finished: {e}"));
                return None;
            }
        };
        let cutover = record.cutover_version.expect("a done move has its cutover");
        let freeze = record.freeze_time().unwrap_or_default();
        print_rows("8842 after ", &rows_per_shard(t, "8842").await);
        claims.check(
            rows_per_shard(t, "8842")
                .await
                .iter()
                .all(|(s, o, l)| s == "shard_3" || (*o == 0 && *l == 0)),
            format!(
                "every row of 8842 is on shard_3, none left on shard_1 (writes refused for {})",
                ms(freeze)
            ),
        );
        Some(Moved {
            started: before_move,
            cutover,
            freeze,
        })
    }

    /// Step 2: every instance converges on the cutover's version.
    async fn instances_converge(&mut self, cutover: i64) {
        let Demo {
            t,
            claims,
            instances,
            ..
        } = self;
        println!("\n== 2. every instance converges on the cutover's version {cutover}");
        let all = converged(t, instances, cutover).await;
        claims.check(
            all,
            "all four instances knew the new version within a second",
        );
    }

    /// Step 3: a deliberately stale client is refused, then retries to the right shard.
    async fn stale_client_is_refused(&mut self) {
        let Demo {
            t,
            claims,
            stale,
            extra,
            ..
        } = self;
        println!("\n== 3. a deliberately stale client is refused, not served");
        println!(
            "   app-stale still routes 8842 by (shard, version): {}",
            stale.ask("route 8842").await
        );
        let (moved_before, line) = stale.rejections("moved").await;
        println!(
            "   $ curl -s {}/metrics | grep rejections   ->  {line}",
            stale.metrics
        );
        let refused = stale.ask("once 8842 stale-refused").await;
        extra.unacked.insert("stale-refused".into(), "8842".into());
        let (_, line) = stale.rejections("moved").await;
        match refused
            .strip_prefix("refused ")
            .map(|r| r.split('\t').collect::<Vec<_>>())
        {
            Some(parts) if parts.len() == 4 => {
                println!(
                    "   without retries, shard_1 answers: ERROR {}: {}\n     DETAIL: {}\n     HINT: {}",
                    parts[0], parts[1], parts[2], parts[3]
                );
                println!(
                    "   $ curl -s {}/metrics | grep rejections   ->  {line}",
                    stale.metrics
                );
                claims.check(
                    parts[0] == "40001",
                    "shard_1 refused the stale write with SQLSTATE 40001",
                );
            }
            _ => claims.check(
                false,
                format!("shard_1 refused the stale write: got {refused}"),
            ),
        }
        let landed = stale.ask("write 8842 stale-2").await;
        let (moved_after, line) = stale.rejections("moved").await;
        println!(
            "   with retries (the default), the router learned the move from the refusal's DETAIL and retried: {landed}"
        );
        println!(
            "   $ curl -s {}/metrics | grep rejections   ->  {line}",
            stale.metrics
        );
        if landed == "committed" {
            extra.acked.insert("stale-2".into(), "8842".into());
        }
        claims.check(
            moved_after >= moved_before + 2,
            format!("app-stale's rejection metric (moved) rose from {moved_before} to {moved_after} on its /metrics"),
        );
        let on_target = t
            .shard("shard_3")
            .await
            .query_opt("SELECT 1 FROM orders WHERE item = 'stale-2'", &[])
            .await
            .unwrap()
            .is_some();
        claims.check(
            landed == "committed" && on_target,
            "its retry landed on shard_3",
        );
    }

    /// Step 4: the guide's bare re-point is refused; history answers where 8842 was.
    async fn repoint_refused_and_history(&mut self, before_move: SystemTime) {
        let Demo { t, claims, .. } = self;
        println!(
            "\n== 4. the guide's bare re-point is refused; history answers \"where was 8842 before?\""
        );
        let dba = t.dba().await;
        let bare =
            "UPDATE shard_directory.shard_directory SET shard_name = 'shard_1', version = version + 1 \
                    WHERE entity_type = 'tenant' AND entity_id = '8842'";
        println!("   $ psql -c \"{bare}\"");
        match dba.execute(bare, &[]).await {
            Err(e) => {
                let db = e.as_db_error();
                println!(
                    "   ERROR {}: {}\n   HINT: {}",
                    db.map(|d| d.code().code()).unwrap_or("?"),
                    db.map(|d| d.message()).unwrap_or(""),
                    db.and_then(|d| d.hint()).unwrap_or("")
                );
                let unchanged = t.placement("8842").await == "shard_3";
                claims.check(
                    db.is_some_and(|d| d.code().code() == "55000") && unchanged,
                    "the bare re-point of an active tenant was refused (55000), and changed nothing",
                );
            }
            Ok(_) => claims.check(false, "the bare re-point of an active tenant was refused"),
        }
        let before_secs = before_move
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let row = dba
            .query_one(
                "SELECT to_timestamp($1)::text, shard_directory.placement_at('tenant', '8842', to_timestamp($1))",
                &[&before_secs],
            )
            .await
            .expect("placement_at");
        let (before_ts, was): (String, Option<String>) = (row.get(0), row.get(1));
        println!(
            "   SELECT shard_directory.placement_at('tenant', '8842', '{before_ts}');  -> {}",
            was.as_deref().unwrap_or("NULL")
        );
        for r in dba
            .query(
                "SELECT version, op, transition, old_shard, new_shard, new_state
                 FROM shard_directory.shard_directory_history WHERE entity_id = '8842' ORDER BY history_id",
                &[],
            )
            .await
            .expect("history")
        {
            println!(
                "   history: version {:>3}  {:<6} {:<16} {:<8} -> {:<8} {}",
                r.get::<_, i64>(0),
                r.get::<_, String>(1),
                r.get::<_, Option<String>>(2).unwrap_or_default(),
                r.get::<_, Option<String>>(3).unwrap_or_default(),
                r.get::<_, Option<String>>(4).unwrap_or_default(),
                r.get::<_, Option<String>>(5).unwrap_or_default()
            );
        }
        claims.check(
            was.as_deref() == Some("shard_1"),
            "history says 8842 was on shard_1 before the move",
        );
    }

    /// Step 5: the directory blocked. Active tenants are served from cache, a tenant mid-move
    /// fails closed, and its move resumes after.
    async fn directory_outage(&mut self) {
        let Demo {
            t,
            claims,
            instances,
            workload,
            ..
        } = self;
        println!("\n== 5. block the directory: active tenants are served from cache, a tenant mid-move fails closed");
        let hold = Progress::new(Some(Phase::Copying));
        let mover = logical_mover(t, hold.clone());
        let mover_task = tokio::spawn(async move {
            mover
                .start(&EntityKey::new("tenant", "17"), "shard_1")
                .await
        });
        hold.held.notified().await;
        let migrating = t.step("SELECT shard_directory.current_version()").await;
        for i in instances.iter() {
            within(DEADLINE, || async { i.learned_at(migrating) }).await;
        }
        println!("   tenant 17 is mid-move (migrating shard_2 -> shard_1, the mover held at its copy); every instance knows it");
        // An instance serves from cache only what it has cached since the last change to it: the
        // workload picks tenants at random, so an instance may not have routed one since.
        for i in instances.iter() {
            for x in TENANTS {
                i.directory()
                    .lookup("tenant", x)
                    .await
                    .expect("the directory is up");
            }
        }
        println!("   every instance has looked up every tenant since its last change");
        t.directory.stop();
        println!("   directory stopped (pg_ctl stop)");
        let disconnected = within(DEADLINE, || async {
            instances
                .iter()
                .all(|i| !i.directory().is_connected())
                .then_some(())
        })
        .await;
        claims.check(disconnected.is_some(), "every instance noticed the outage");
        let before = workload.ledger();
        let count = |l: &Ledger, tenant: &str| l.acked.values().filter(|x| *x == tenant).count();
        let served = within(DEADLINE, || async {
            let now = workload.ledger();
            (["8842", "23", "101"]
                .iter()
                .all(|x| count(&now, x) >= count(&before, x) + 10)
                && now.failures_of("17") >= before.failures_of("17") + 3)
                .then_some(now)
        })
        .await;
        if let Some(now) = &served {
            for x in TENANTS {
                println!(
                    "   during the outage, tenant {x:>4}: {} writes committed, {} writes or reads failed",
                    count(now, x) - count(&before, x),
                    now.failures_of(x) - before.failures_of(x)
                );
            }
        }
        for i in instances.iter() {
            let view = i.debug_view().await;
            let closed = i.directory().lookup("tenant", "17").await;
            println!(
                "   {}: connected {}, served from cache {} times; tenant 17: {}",
                i.name,
                view["connected"],
                view["stats"]["serving_stale"],
                match closed {
                    Ok(e) => format!("served ({:?}), which it must not be", e.state),
                    Err(e) => format!("{e}"),
                }
            );
        }
        claims.check(
            served.as_ref().is_some_and(|now| {
                ["8842", "23", "101"]
                    .iter()
                    .all(|x| now.failures_of(x) == before.failures_of(x))
            }),
            "active tenants kept committing from cache, with no failure; tenant 17 failed closed",
        );

        t.directory.restart();
        let back = within(DEADLINE, || async {
            instances
                .iter()
                .all(|i| i.directory().is_connected())
                .then_some(())
        })
        .await;
        claims.check(
            back.is_some(),
            "the directory restarted and every instance reconnected",
        );
        hold.release.notify_one();
        let record_17 = match mover_task.await.expect("the mover task") {
            Ok(r) => Ok(r),
            Err(failure) => {
                println!(
                    "   the mover lost its directory connection in the outage and stopped ({}); `resume` continues it:",
                    failure.error
                );
                match failure.move_id {
                    Some(id) => {
                        t.mover(MoveOptions::default())
                            .with_observer(Progress::new(None))
                            .resume(id)
                            .await
                    }
                    None => Err(failure),
                }
            }
        };
        match &record_17 {
            Ok(r) => {
                let v = r.cutover_version.expect("done");
                println!("   tenant 17 moved to shard_1 at version {v}; the instances converge:");
                let all = converged(t, instances, v).await;
                claims.check(all, "after the restart, every instance knew the new version within a second of its commit");
            }
            Err(e) => claims.check(
                false,
                format!("the move of tenant 17 finished after the outage: {e}"),
            ),
        }
    }

    /// The summary: what the workload did, and the audit of every acknowledged order.
    async fn summary(self, freeze: Duration) -> Claims {
        let Demo {
            t,
            mut claims,
            routers,
            workload,
            extra,
            seeded,
            ..
        } = self;
        println!("\n== summary");
        let mut ledger = workload.stop().await;
        let (attempted, committed) = (ledger.attempted(seeded), ledger.acked.len() - seeded);
        let failed_writes: u64 = ledger.failed.values().sum();
        let (reads, failed_reads) = (ledger.reads, ledger.failed_reads.values().sum::<u64>());
        // The stale instance's orders are audited too.
        ledger.acked.extend(extra.acked);
        ledger.unacked.extend(extra.unacked);
        let audit = Audit::of(&t, &ledger).await;
        let by_reason = refusals(&routers);
        let retries: u64 = routers.iter().map(|r| r.directory().stats().retries).sum();
        let mut failed: BTreeMap<String, u64> = BTreeMap::new();
        for ((tenant, kind), n) in &ledger.failed {
            *failed
                .entry(format!("{kind} (tenant {tenant})"))
                .or_default() += n;
        }
        println!("   writes attempted   {attempted} (by the workload)");
        println!("   writes committed   {committed}");
        println!(
            "   retried            {retries} (by the workload); shard refusals by reason {by_reason:?}"
        );
        println!("   writes failed      {failed_writes} {failed:?}");
        for (kind, e) in &ledger.first_error {
            println!("     first {kind}: {e}");
        }
        println!("   reads              {reads} ok, {failed_reads} failed");
        println!("   rows per tenant per shard (orders/lines):");
        println!(
            "     tenant  {}",
            t.shards
                .iter()
                .map(|(s, _)| format!("{s:>14}"))
                .collect::<String>()
        );
        for tenant in TENANTS {
            println!(
                "     {tenant:>6}  {}",
                t.shards
                    .iter()
                    .map(|(s, _)| {
                        let (o, l) = audit.rows_of(tenant, s);
                        format!("{:>14}", format!("{o}/{l}"))
                    })
                    .collect::<String>()
            );
        }
        println!(
            "   rows lost          {} (acknowledged orders found nowhere); stored twice {}; on a shard the directory does not name {}",
            audit.lost.len(),
            audit.duplicated.len(),
            audit.misplaced.len()
        );
        println!(
            "   move of 8842       {} orders with their lines, writes refused for {}",
            SEEDED,
            ms(freeze)
        );
        claims.check(audit.holds(), format!("no acknowledged order lost, none stored twice or on a shard the directory does not name ({})", if audit.holds() { "0 lost".to_owned() } else { audit.problems() }));
        claims.check(
            ledger.failed.keys().all(|(tenant, _)| tenant == "17"),
            "the only failed writes were tenant 17's, during the outage",
        );
        claims.check(
            ledger.fatal.is_empty(),
            "every error the application saw was retryable",
        );
        claims
    }
}

async fn scenario() -> Claims {
    let mut demo = Demo::start().await;
    let Some(moved) = demo.move_under_load().await else {
        return demo.claims;
    };
    demo.instances_converge(moved.cutover).await;
    demo.stale_client_is_refused().await;
    demo.repoint_refused_and_history(moved.started).await;
    demo.directory_outage().await;
    demo.summary(moved.freeze).await
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(stale::ARG) {
        stale::run().await;
        return ExitCode::SUCCESS;
    }
    let claims = tokio::select! {
        c = scenario() => c,
        _ = tokio::signal::ctrl_c() => {
            println!("\ninterrupted: the clusters are removed");
            return ExitCode::from(130);
        }
    };
    if claims.0.is_empty() {
        println!("\nevery claim held; the clusters are removed.");
        ExitCode::SUCCESS
    } else {
        println!("\n{} claims did not hold: {:?}", claims.0.len(), claims.0);
        ExitCode::FAILURE
    }
}
