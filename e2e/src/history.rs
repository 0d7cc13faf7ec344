//! A randomized history, in the spirit of Jepsen: routers of every kind the client offers (one
//! with its own LISTEN, one following the relay, one sharing a Redis cache, one reading the
//! directory's standbys) write to many tenants while a seeded schedule of events runs against
//! the directory: re-points, moves by the mover, restarts and crashes, a failover to the
//! standby behind the directory's address, restores from a cold copy or a base backup (some
//! making at once a change that numbers a lost version again), a second standby promoted by
//! mistake and changed there, a standby's replay paused or the standby stopped, the relay and
//! Redis restarted.
//!
//! The invariant: every acknowledged write was committed, once, on a shard that the directory's
//! surviving primary named for its tenant at some moment of the write (allowing [`LAG`] for a
//! change to reach the routers), or it was refused; and its row is then on exactly one shard
//! (a move neither lost nor doubled it). The schedule is the only writer of the directory, so it
//! keeps what the primary named, and when: a restore puts back what the copy held, as of the
//! moment it is started again. Where a write was committed is read from a log each shard keeps
//! by a user trigger on `orders`, which the mover's copies do not fire. A router that keeps
//! routing by a history the directory left (a lost version, a stray server's change) writes
//! where the surviving primary never named, past the lag, and is caught; so is a write that went
//! nowhere, or twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shard_directory_client::{Directory, DirectoryConfig, RelayConfig, SharedCacheConfig};

use crate::cluster::ColdCopy;
use crate::redis::RedisServer;
use crate::topology::{connected_directory, DIRECTORY_DB};
use crate::workload::{Orders, Writes};
use crate::Topology;

/// How long a change may take to reach every router: a poll (1 s), the relay's silence (1 s)
/// and its question to the directory (at most once a second), with room for a loaded machine.
pub const LAG: Duration = Duration::from_secs(4);

/// The relay's key.
const KEY: &[u8] = b"the history's relay key";

/// What the schedule can do, with how often (weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    Repoint,
    Move,
    Failover,
    Restart,
    Crash,
    ColdCopy,
    BaseBackup,
    Restore,
    RestoreAndChange,
    StrayPromotion,
    PauseReplay,
    ResumeReplay,
    StandbyStop,
    StandbyStart,
    RelayRestart,
    RedisRestart,
}

const WEIGHTS: [(Event, u32); 16] = [
    (Event::Repoint, 12),
    (Event::Move, 2),
    (Event::Failover, 1),
    (Event::Restart, 2),
    (Event::Crash, 1),
    (Event::ColdCopy, 1),
    (Event::BaseBackup, 3),
    (Event::Restore, 3),
    (Event::RestoreAndChange, 3),
    (Event::StrayPromotion, 1),
    (Event::PauseReplay, 1),
    (Event::ResumeReplay, 1),
    (Event::StandbyStop, 1),
    (Event::StandbyStart, 1),
    (Event::RelayRestart, 1),
    (Event::RedisRestart, 1),
];

fn pick(rng: &mut fastrand::Rng) -> Event {
    let total: u32 = WEIGHTS.iter().map(|(_, w)| w).sum();
    let mut at = rng.u32(..total);
    for (event, weight) in WEIGHTS {
        if at < weight {
            return event;
        }
        at -= weight;
    }
    unreachable!("the weights cover the range")
}

/// What the primary named for each tenant, and when: closed intervals, liberal at both ends
/// (a change is in force from when it was sent; the old placement until it returned).
#[derive(Default)]
struct Placements {
    open: BTreeMap<String, (String, Instant)>,
    closed: Vec<(String, String, Instant, Instant)>,
}

impl Placements {
    fn now(&self) -> BTreeMap<String, String> {
        self.open
            .iter()
            .map(|(t, (s, _))| (t.clone(), s.clone()))
            .collect()
    }

    fn change(&mut self, tenant: &str, shard: &str, sent: Instant, returned: Instant) {
        if let Some((old, since)) = self.open.remove(tenant) {
            self.closed.push((tenant.into(), old, since, returned));
        }
        self.open.insert(tenant.into(), (shard.into(), sent));
    }

    /// The primary now holds `placements` (a restore), from `from` (the old server's stop);
    /// what it held before is closed at `to` (the restored server's start).
    fn switch(&mut self, placements: &BTreeMap<String, String>, from: Instant, to: Instant) {
        for (tenant, (old, since)) in std::mem::take(&mut self.open) {
            self.closed.push((tenant, old, since, to));
        }
        for (tenant, shard) in placements {
            self.open.insert(tenant.clone(), (shard.clone(), from));
        }
    }

    /// Whether `shard` was named for `tenant` at some moment of `[from, to]`.
    fn named(&self, tenant: &str, shard: &str, from: Instant, to: Instant) -> bool {
        let open = self
            .open
            .get(tenant)
            .is_some_and(|(s, since)| s == shard && *since <= to);
        open || self
            .closed
            .iter()
            .any(|(t, s, a, b)| t == tenant && s == shard && *a <= to && *b >= from)
    }
}

/// One acknowledged write.
struct Acked {
    router: &'static str,
    tenant: String,
    item: String,
    started: Instant,
    acked: Instant,
}

/// What a run did, and what it found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub events: BTreeMap<String, usize>,
    pub acked: BTreeMap<&'static str, usize>,
    pub refused: BTreeMap<&'static str, usize>,
    /// Writes acknowledged on a shard the surviving primary did not name (within the lag),
    /// found on no shard, or on two.
    pub violations: Vec<String>,
    /// Routers that, after the schedule, did not come to say what the directory says.
    pub unconverged: Vec<String>,
    /// Restores, each with the copy's kind and the re-points it lost.
    pub restores: Vec<String>,
    /// What each router's counters say it went through.
    pub stats: BTreeMap<&'static str, String>,
}

impl Report {
    pub fn holds(&self) -> bool {
        self.violations.is_empty() && self.unconverged.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "history seed {}: events {:?}", self.seed, self.events)?;
        writeln!(f, "  acked {:?}, refused {:?}", self.acked, self.refused)?;
        writeln!(f, "  restores {:?}", self.restores)?;
        for (router, stats) in &self.stats {
            writeln!(f, "  {router}: {stats}")?;
        }
        for v in self.violations.iter().take(10) {
            writeln!(f, "  VIOLATION {v}")?;
        }
        if self.violations.len() > 10 {
            writeln!(f, "  ... {} violations in all", self.violations.len())?;
        }
        for u in &self.unconverged {
            writeln!(f, "  UNCONVERGED {u}")?;
        }
        Ok(())
    }
}

/// The tenants the routers write to: the first [`REPOINTED`] are re-pointed (a DBA's
/// emergency, leaving their rows where they were), the others moved with their rows: a move
/// onto a shard that still holds rows a re-point left there would delete them (the mover empties
/// the target's rows of the entity before it copies).
const TENANTS: usize = 8;
const REPOINTED: usize = 6;

fn tenant(i: usize) -> String {
    format!("h{i}")
}

fn repointed(rng: &mut fastrand::Rng) -> String {
    tenant(rng.usize(..REPOINTED))
}

/// Where each shard logs the items committed by the application: a user trigger, which the
/// mover's copies (as `session_replication_role = replica`) do not fire.
const COMMIT_LOG: &str = "
    CREATE TABLE orders_log (item text PRIMARY KEY);
    CREATE FUNCTION log_order() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = public AS $$
        BEGIN INSERT INTO orders_log VALUES (NEW.item); RETURN NULL; END $$;
    CREATE TRIGGER log_order AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION log_order();";

/// The re-point of `tenant` to `shard`, as a DBA makes it in an emergency; a statement a line
/// (as `postgres --single` takes them).
fn repoint_sql(tenant: &str, shard: &str) -> String {
    format!(
        "BEGIN;\nSET LOCAL shard_directory.allow_repoint = on;\n\
         UPDATE shard_directory.shard_directory SET shard_name = '{shard}' \
         WHERE entity_type = 'tenant' AND entity_id = '{tenant}';\nCOMMIT;\n"
    )
}

fn other(shard: &str) -> &'static str {
    if shard == "shard_1" {
        "shard_2"
    } else {
        "shard_1"
    }
}

/// `shard-directory relay` on `t`'s directory, publishing to `redis` (killed on drop).
fn relay(t: &Topology, redis: &RedisServer) -> tokio::process::Child {
    crate::mover_cli::relay(t, &redis.url(), KEY, "postgres")
}

/// The routers' common settings: a poll every second, quick reconnects.
fn settings() -> DirectoryConfig {
    let second = Duration::from_secs(1);
    DirectoryConfig::default()
        .poll_interval(second)
        .connect_timeout(second)
        .query_timeout(second)
        .max_reconnect_backoff(Duration::from_millis(200))
}

/// `f`, which waits on a server's tools, on this worker alone: the routers' tasks go on.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

/// Runs the schedule of `seed`, `events` long, and judges what the routers wrote. Needs a
/// multi-threaded runtime (the events wait on `pg_ctl` while the routers write).
pub async fn run(seed: u64, events: usize) -> Report {
    let mut rng = fastrand::Rng::with_seed(seed);
    let t = Topology::durable(&format!("hist{seed}")).await;
    t.on_every_shard(COMMIT_LOG).await;
    for i in 0..TENANTS {
        t.add_tenant(&tenant(i), "shard_1").await;
    }
    let placements = Arc::new(Mutex::new(Placements::default()));
    {
        let mut p = placements.lock().unwrap();
        for i in 0..TENANTS {
            p.change(&tenant(i), "shard_1", Instant::now(), Instant::now());
        }
    }
    let standby = t.directory.standby(&format!("hist{seed}-s1"));
    let stray = t.directory.standby(&format!("hist{seed}-s2"));
    let mut redis = RedisServer::start().await;
    let mut relay_process = relay(&t, &redis);

    let base = settings();
    let at = t.directory_config();
    let routers: Vec<(&'static str, Directory)> = vec![
        (
            "listening",
            connected_directory(at.clone(), base.clone()).await,
        ),
        (
            "relayed",
            connected_directory(
                at.clone(),
                base.clone().relay(
                    RelayConfig::new(redis.url(), KEY.to_vec()).silence(Duration::from_secs(1)),
                ),
            )
            .await,
        ),
        (
            "shared",
            connected_directory(
                at.clone(),
                base.clone()
                    .shared_cache(SharedCacheConfig::new(redis.url())),
            )
            .await,
        ),
        (
            "replicas",
            connected_directory(
                at.clone(),
                base.clone()
                    .replica(standby.config(DIRECTORY_DB))
                    .replica(stray.config(DIRECTORY_DB))
                    .replica_wait(Duration::from_millis(200)),
            )
            .await,
        ),
    ];

    let acked = Arc::new(Mutex::new(Vec::<Acked>::new()));
    let refused = Arc::new(Mutex::new(BTreeMap::<&'static str, usize>::new()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut writers = Vec::new();
    for (i, (name, directory)) in routers.iter().enumerate() {
        let router = t.router(directory.clone());
        let (name, acked, refused, stopped) =
            (*name, acked.clone(), refused.clone(), stopped.clone());
        let mut rng = fastrand::Rng::with_seed(seed ^ (i as u64 + 1));
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !*stopped.borrow() {
                n += 1;
                let tenant = tenant(rng.usize(..TENANTS));
                let item = format!("{name}-{n}");
                let started = Instant::now();
                match Orders.write(&router, &tenant, &item).await {
                    Ok(()) => acked.lock().unwrap().push(Acked {
                        router: name,
                        tenant,
                        item,
                        started,
                        acked: Instant::now(),
                    }),
                    Err(_) => *refused.lock().unwrap().entry(name).or_default() += 1,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    let mut report = Report {
        seed,
        ..Report::default()
    };
    // The copy to restore: what it holds, its kind, and the re-points made since.
    let mut copy: Option<(ColdCopy, BTreeMap<String, String>)> = None;
    let (mut copy_kind, mut lost) = ("", 0);
    let mut stray_promoted = false;
    let mut standby_up = true;
    // Whether a restore left the standby on a history the primary no longer has.
    let mut standby_behind = false;
    for _ in 0..events {
        let event = pick(&mut rng);
        let done = match event {
            Event::Repoint => {
                let who = repointed(&mut rng);
                let to = other(&placements.lock().unwrap().now()[&who]).to_owned();
                let sent = Instant::now();
                lost += 1;
                t.dba()
                    .await
                    .batch_execute(&repoint_sql(&who, &to))
                    .await
                    .expect("re-point");
                placements
                    .lock()
                    .unwrap()
                    .change(&who, &to, sent, Instant::now());
                true
            }
            Event::Move => {
                let who = tenant(rng.usize(REPOINTED..TENANTS));
                let to = other(&placements.lock().unwrap().now()[&who]).to_owned();
                let sent = Instant::now();
                t.move_tenant(&who, &to).await;
                placements
                    .lock()
                    .unwrap()
                    .change(&who, &to, sent, Instant::now());
                // A copy from before the move names the shard the move emptied: restored, the
                // directory would send the tenant's writes where its rows no longer are.
                copy = None;
                true
            }
            // Behind an address that moves: the standby promoted once it has replayed every
            // change (one that lost changes is a restore, which the schedule makes otherwise),
            // then rebuilt as the new primary's standby. A standby that cannot catch up (a
            // restore left it on another history, or its WAL was recycled while it was down)
            // is rebuilt first, as a DBA does before counting on it.
            Event::Failover => {
                if !standby_behind && !standby_up {
                    blocking(|| standby.restart());
                }
                if standby_behind || !replays_the_primary(&t, &standby).await {
                    blocking(|| standby.follow(&t.directory));
                    assert!(
                        replays_the_primary(&t, &standby).await,
                        "the rebuilt standby does not replay the primary:\n{}",
                        standby.server_log()
                    );
                }
                (standby_up, standby_behind) = (true, false);
                blocking(|| {
                    t.directory.crash();
                    standby.promote();
                    t.directory.take_over(&standby);
                    standby.follow(&t.directory);
                });
                true
            }
            Event::StandbyStop if standby_up => {
                blocking(|| standby.crash());
                standby_up = false;
                true
            }
            Event::StandbyStart if !standby_up => {
                blocking(|| standby.restart());
                standby_up = true;
                true
            }
            Event::StandbyStop | Event::StandbyStart => false,
            Event::Restart => {
                blocking(|| {
                    t.directory.stop_or_crash();
                    t.directory.restart();
                });
                true
            }
            Event::Crash => {
                blocking(|| {
                    t.directory.crash();
                    t.directory.restart();
                });
                true
            }
            Event::ColdCopy => {
                let now = placements.lock().unwrap().now();
                copy = Some((blocking(|| t.directory.cold_copy()), now));
                (copy_kind, lost) = ("cold", 0);
                true
            }
            Event::BaseBackup => {
                let now = placements.lock().unwrap().now();
                copy = Some((blocking(|| t.directory.base_backup()), now));
                (copy_kind, lost) = ("base backup", 0);
                true
            }
            Event::Restore | Event::RestoreAndChange => match &copy {
                None => false,
                Some((held, then)) => {
                    let mut then = then.clone();
                    let from = Instant::now();
                    // A change made before any router can connect numbers the first lost
                    // version again, with other contents.
                    let change = (event == Event::RestoreAndChange).then(|| {
                        let who = repointed(&mut rng);
                        let to = other(&then[&who]).to_owned();
                        (who, to)
                    });
                    blocking(|| {
                        t.directory.put_back_cold_copy(held);
                        if let Some((who, to)) = &change {
                            t.directory
                                .single_user_sql(DIRECTORY_DB, &repoint_sql(who, to));
                        }
                        t.directory.restart();
                    });
                    standby_behind = true;
                    report.restores.push(format!(
                        "{copy_kind}, {lost} re-points lost{}",
                        if change.is_some() {
                            ", one made at once"
                        } else {
                            ""
                        }
                    ));
                    lost = 0;
                    then.extend(change);
                    placements
                        .lock()
                        .unwrap()
                        .switch(&then, from, Instant::now());
                    true
                }
            },
            // While the stray standby still follows the directory: one that diverged (after a
            // restore) may never finish its recovery.
            Event::StrayPromotion if !stray_promoted && report.restores.is_empty() => {
                stray_promoted = true;
                blocking(|| stray.promote());
                // The stray server goes on a history of its own: a change only it has.
                let who = repointed(&mut rng);
                let to = other(&placements.lock().unwrap().now()[&who]).to_owned();
                let sql = repoint_sql(&who, &to);
                crate::eventually("the stray server to take writes", LAG * 4, || async {
                    stray
                        .connect(DIRECTORY_DB)
                        .await
                        .batch_execute(&sql)
                        .await
                        .ok()
                })
                .await;
                true
            }
            Event::StrayPromotion => false,
            Event::PauseReplay | Event::ResumeReplay if standby_up => {
                let sql = if event == Event::PauseReplay {
                    "SELECT pg_wal_replay_pause()"
                } else {
                    "SELECT pg_wal_replay_resume()"
                };
                standby
                    .connect(DIRECTORY_DB)
                    .await
                    .batch_execute(sql)
                    .await
                    .is_ok()
            }
            Event::PauseReplay | Event::ResumeReplay => false,
            Event::RelayRestart => {
                let _ = relay_process.kill().await;
                relay_process = relay(&t, &redis);
                true
            }
            Event::RedisRestart => {
                redis.restart().await;
                true
            }
        };
        if done {
            *report.events.entry(format!("{event:?}")).or_default() += 1;
        }
        // After a restore, long enough that writes past the lag show where the routers went
        // before the next change (which gives the restored directory a lineage of its own).
        let pause = match event {
            Event::Restore | Event::RestoreAndChange if done => LAG * 2,
            _ => Duration::from_millis(rng.u64(200..800)),
        };
        tokio::time::sleep(pause).await;
    }

    // Every router comes to say what the surviving primary says.
    let last = placements.lock().unwrap().now();
    for (name, directory) in &routers {
        let deadline = Instant::now() + LAG * 3;
        for (who, shard) in &last {
            loop {
                let said = directory
                    .lookup("tenant", who)
                    .await
                    .map(|e| e.shard_name.to_string());
                if said.as_deref().ok() == Some(shard.as_str()) {
                    break;
                }
                if Instant::now() >= deadline {
                    report.unconverged.push(format!(
                        "{name}: tenant {who} on {said:?}, the directory says {shard}"
                    ));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    stop.send_replace(true);
    for writer in writers {
        writer.await.expect("a writer");
    }
    let _ = relay_process.kill().await;
    for (name, directory) in &routers {
        let s = directory.stats();
        report.stats.insert(
            name,
            format!(
                "regressions {}, epoch changes {}, replica reads {} (fallbacks {}), shared hits \
                 {}, relay taken {} (refused {})",
                s.version_regressions,
                s.epoch_changes,
                s.replica_reads,
                s.replica_fallbacks,
                s.shared_cache_hits,
                s.relay_messages,
                s.relay_refused
            ),
        );
    }

    let (placements, acked) = (
        std::mem::take(&mut *placements.lock().unwrap()),
        std::mem::take(&mut *acked.lock().unwrap()),
    );
    judge(&t, &placements, &acked, &mut report).await;
    report.refused = refused.lock().unwrap().clone();
    report
}

/// Finds each acknowledged write's shard and holds it against what the primary named.
async fn judge(t: &Topology, placements: &Placements, acked: &[Acked], report: &mut Report) {
    let (committed, found) = (
        items_by_shard(t, "SELECT item FROM orders_log").await,
        items_by_shard(t, "SELECT item FROM orders").await,
    );
    for write in acked {
        *report.acked.entry(write.router).or_default() += 1;
        let on =
            |by: &HashMap<String, Vec<String>>| by.get(&write.item).cloned().unwrap_or_default();
        let problem = match (on(&committed).as_slice(), on(&found).len()) {
            ([], _) => Some("committed on no shard".to_owned()),
            ([shard], _)
                if !placements.named(&write.tenant, shard, since(write.started), write.acked) =>
            {
                Some(format!(
                    "committed on {shard}, never named for it by the surviving primary then"
                ))
            }
            ([_], 1) => None,
            ([shard], n) => Some(format!("committed on {shard}, now on {n} shards")),
            (more, _) => Some(format!("committed on {more:?}")),
        };
        if let Some(problem) = problem {
            report.violations.push(format!(
                "{} wrote {} for tenant {} ({:?} after the start): {problem}",
                write.router,
                write.item,
                write.tenant,
                write.started.duration_since(placements_start(placements)),
            ));
        }
    }
}

/// Whether `standby`, its replay resumed, replays what the primary has written so far within
/// twice the lag.
async fn replays_the_primary(t: &Topology, standby: &crate::Cluster) -> bool {
    let at: String = t
        .dba()
        .await
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("the primary's position")
        .get(0);
    let replica = standby.connect(DIRECTORY_DB).await;
    replica
        .batch_execute("SELECT pg_wal_replay_resume()")
        .await
        .expect("resume replay");
    crate::within(LAG * 2, || async {
        let row = replica
            .query_one(
                "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                &[&at],
            )
            .await
            .ok()?;
        row.get::<_, bool>(0).then_some(())
    })
    .await
    .is_some()
}

/// Each item `sql` reads from every shard, with the shards it is on.
async fn items_by_shard(t: &Topology, sql: &str) -> HashMap<String, Vec<String>> {
    let mut by: HashMap<String, Vec<String>> = HashMap::new();
    for (shard, _) in &t.shards {
        for item in crate::column(&t.shard(shard).await, sql, &[]).await {
            by.entry(item).or_default().push(shard.clone());
        }
    }
    by
}

/// `LAG` before `at` (or `at`, this early in the process).
fn since(at: Instant) -> Instant {
    at.checked_sub(LAG).unwrap_or(at)
}

/// When the run's first placement began.
fn placements_start(p: &Placements) -> Instant {
    p.closed
        .iter()
        .map(|(_, _, a, _)| *a)
        .chain(p.open.values().map(|(_, a)| *a))
        .min()
        .unwrap_or_else(Instant::now)
}
