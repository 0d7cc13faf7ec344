//! The failpoint sweep: every step of a move that changes state (the mover's failpoints,
//! `mover/src/failpoint.rs`), faulted every way, under a writer, for every kind of move; after
//! each case the three invariants of a move are checked:
//!
//! 1. **a refused entity always comes back**: the writer never goes longer than the freeze's
//!    lease (plus the time a restarted server takes) without a committed write, and once the
//!    faulted command has ended it writes again with no person acting;
//! 2. **what is reported is what happened**: every command's exit code and `--json` agree with
//!    the directory (entry and move record) right after it ends;
//! 3. **rows exactly once**: once the move is over (finished by `resume` or `abort`, whichever the
//!    case takes), every acknowledged write of the tenant is on the shard the directory names,
//!    once, with its line; nothing of the tenant is on the other shard; no replication object of
//!    the move is left.
//!
//! The cases are not listed by hand: a census runs each scenario once with
//! `SD_FAILPOINT_CENSUS`, and every point it reaches is swept with every fault, so a step given a
//! point is swept from then on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use shard_directory_client::Router;
use tokio::sync::watch;

use crate::mover_cli::{self, Held};
use crate::workload::{write_order, Audit, Ledger};
use crate::Topology;

/// `--max-freeze` of every swept move, and `--lease-grace`: the lease is their sum.
pub const MAX_FREEZE: Duration = Duration::from_secs(2);
pub const LEASE_GRACE: Duration = Duration::from_secs(1);
/// What a restarted server, a writer's backoff and a router's release request add to a lease.
const SLACK: Duration = Duration::from_secs(6);
/// Longest any one command of a case may run.
const COMMAND_DEADLINE: Duration = Duration::from_secs(120);

/// The tuning every command of the sweep runs with.
fn tuning() -> Vec<String> {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    [
        "--json",
        "--lease-grace",
        &ms(LEASE_GRACE),
        "--fence-wait",
        "10s",
        "--directory-patience",
        "20s",
        "--sync-timeout",
        "60s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A server a fault restarts or cuts the mover's sessions of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Directory,
    /// Where every swept tenant starts.
    Shard1,
    Shard2,
}

/// What happens at a failpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The mover is SIGKILLed there.
    Kill,
    /// The step fails as a database error would make it.
    Error,
    /// The step waits past the lease first.
    Stall,
    /// The server stops as a crash would and starts again, the mover waiting meanwhile.
    Restart(Server),
    /// The mover's sessions on the server are ended (`pg_terminate_backend`).
    Drop(Server),
}

pub const FAULTS: [Fault; 9] = [
    Fault::Kill,
    Fault::Error,
    Fault::Stall,
    Fault::Restart(Server::Directory),
    Fault::Restart(Server::Shard1),
    Fault::Restart(Server::Shard2),
    Fault::Drop(Server::Directory),
    Fault::Drop(Server::Shard1),
    Fault::Drop(Server::Shard2),
];

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = |s: &Server| match s {
            Server::Directory => "directory",
            Server::Shard1 => "shard_1",
            Server::Shard2 => "shard_2",
        };
        match self {
            Fault::Kill => f.write_str("kill"),
            Fault::Error => f.write_str("error"),
            Fault::Stall => f.write_str("stall"),
            Fault::Restart(s) => write!(f, "restart-{}", server(s)),
            Fault::Drop(s) => write!(f, "drop-{}", server(s)),
        }
    }
}

/// A kind of move, and the command whose steps are swept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// `move --method copy`.
    Copy,
    /// `move --method logical`.
    Logical,
    /// `move --method logical --max-rate`: the mover's own paced initial copy.
    Paced,
    /// `move --reversible`, then `finalize` once it is over.
    Reversible,
    /// `revert` of a reversible move.
    Revert,
    /// `resume` of a move whose mover was killed while the tenant was frozen.
    Resume,
    /// `abort` of a move whose mover was killed while the tenant was frozen.
    Abort,
    /// `move --from-file`: a plan run as a batch.
    Batch,
}

pub const SCENARIOS: [Scenario; 8] = [
    Scenario::Copy,
    Scenario::Logical,
    Scenario::Paced,
    Scenario::Reversible,
    Scenario::Revert,
    Scenario::Resume,
    Scenario::Abort,
    Scenario::Batch,
];

impl Scenario {
    pub fn name(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

/// One case: a scenario's command faulted at a point.
#[derive(Debug, Clone)]
pub struct Case {
    pub scenario: Scenario,
    pub point: String,
    pub fault: Fault,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.scenario.name(), self.point, self.fault)
    }
}

/// The shared state of a sweep: its topology, a scratch folder, and a counter for tenant names.
pub struct Sweep {
    pub t: Topology,
    scratch: PathBuf,
    cases_run: usize,
}

/// What one command printed and how it ended.
#[derive(Debug)]
struct Ran {
    args: Vec<String>,
    /// None when it was killed (by its failpoint).
    code: Option<i32>,
    json: Option<Value>,
    stderr: String,
}

impl Sweep {
    pub async fn start(name: &str) -> Sweep {
        let t = Topology::durable(name).await;
        let scratch = t.directory.scratch_path("sweep");
        std::fs::create_dir_all(&scratch).expect("the sweep's scratch folder");
        Sweep {
            t,
            scratch,
            cases_run: 0,
        }
    }

    /// Every point `scenario`'s command reaches when nothing is faulted, in the order first
    /// reached; the census run is itself checked as a case.
    pub async fn census(&mut self, scenario: Scenario) -> Result<Vec<String>, String> {
        let file = self.scratch.join(format!("census-{}", scenario.name()));
        let _ = std::fs::remove_file(&file);
        self.run(scenario, None, Some(&file)).await?;
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut points: Vec<String> = Vec::new();
        for p in text.lines() {
            if !points.iter().any(|q| q == p) {
                points.push(p.to_owned());
            }
        }
        Ok(points)
    }

    /// Runs `case`; `Err` says which invariant broke, and how.
    pub async fn case(&mut self, case: &Case) -> Result<(), String> {
        self.run(case.scenario, Some(case), None).await
    }

    async fn run(
        &mut self,
        scenario: Scenario,
        case: Option<&Case>,
        census: Option<&Path>,
    ) -> Result<(), String> {
        self.cases_run += 1;
        let tenant = format!("sw{}", self.cases_run);
        let t = &self.t;
        t.add_tenant(&tenant, "shard_1").await;
        let seeded = t.seed_orders("shard_1", &tenant, 30, 1).await;
        let writer = Writer::start(t, &tenant, &seeded).await;
        let setup = self.set_up(scenario, &tenant).await?;
        let args = self.swept_args(scenario, &tenant, setup.as_ref());
        let faulted = self.faulted(&args, case, census).await?;
        let ended = Instant::now();
        self.reported(&faulted).await?;
        writer
            .writes_again_after(ended, lease() + SLACK)
            .await
            .map_err(|e| format!("invariant 1 (comes back without a person): {e}"))?;
        // Half the cases end what is left open with `abort`, half with `resume`.
        self.finish(scenario, &tenant, self.cases_run.is_multiple_of(2))
            .await?;
        let (ledger, longest) = writer.stop().await;
        if longest > lease() + SLACK {
            return Err(format!(
                "invariant 1 (a refused entity comes back): the writer committed nothing for \
                 {longest:?}, more than the lease {:?} plus {SLACK:?}",
                lease()
            ));
        }
        self.exactly_once(&tenant, &ledger).await
    }

    /// What a scenario needs before its swept command: the id of the move it works on.
    async fn set_up(&self, scenario: Scenario, tenant: &str) -> Result<Option<i64>, String> {
        let t = &self.t;
        match scenario {
            Scenario::Revert => {
                let ran = self
                    .command(&self.move_args(tenant, "logical", &["--reversible"]), &[])
                    .await;
                let id = ran.json.as_ref().and_then(|j| j["move_id"].as_i64());
                if ran.code != Some(0) || id.is_none() {
                    return Err(format!("setting up: the reversible move failed: {ran:?}"));
                }
                Ok(id)
            }
            Scenario::Resume | Scenario::Abort => {
                // Killed once the source is fenced: the tenant is frozen, its mover gone.
                let ran = self
                    .command(
                        &self.move_args(tenant, "logical", &[]),
                        &[("FAILPOINTS", "enter.verified=return(kill)".into())],
                    )
                    .await;
                if ran.code.is_some() {
                    return Err(format!(
                        "setting up: the move was not killed frozen: {ran:?}"
                    ));
                }
                let (id, phase) = mover_cli::open_phase(t, tenant)
                    .await
                    .ok_or("setting up: no open move after the kill")?;
                if phase.as_str() != "frozen" {
                    return Err(format!("setting up: killed in {phase}, not frozen"));
                }
                Ok(Some(id))
            }
            _ => Ok(None),
        }
    }

    fn move_args(&self, tenant: &str, method: &str, more: &[&str]) -> Vec<String> {
        let ms = format!("{}ms", MAX_FREEZE.as_millis());
        let mut args: Vec<String> = [
            "move",
            "tenant",
            tenant,
            "--to",
            "shard_2",
            "--method",
            method,
            "--max-freeze",
            &ms,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(more.iter().map(|s| s.to_string()));
        args
    }

    fn swept_args(&self, scenario: Scenario, tenant: &str, setup: Option<&i64>) -> Vec<String> {
        let id = || setup.expect("set up with a move").to_string();
        match scenario {
            Scenario::Copy => self.move_args(tenant, "copy", &[]),
            Scenario::Logical => self.move_args(tenant, "logical", &[]),
            Scenario::Paced => self.move_args(tenant, "logical", &["--max-rate", "2000"]),
            Scenario::Reversible => self.move_args(tenant, "logical", &["--reversible"]),
            Scenario::Revert => vec!["revert".into(), id()],
            Scenario::Resume => vec!["resume".into(), id()],
            Scenario::Abort => vec!["abort".into(), id()],
            Scenario::Batch => {
                let plan = self.scratch.join(format!("plan-{tenant}.json"));
                let moves = serde_json::json!({"purpose": "sweep", "moves": [
                    {"entity_type": "tenant", "entity_id": tenant, "from": "shard_1", "to": "shard_2"}
                ]});
                std::fs::write(&plan, moves.to_string()).expect("write the plan");
                let ms = format!("{}ms", MAX_FREEZE.as_millis());
                vec![
                    "move".into(),
                    "--from-file".into(),
                    plan.display().to_string(),
                    "--method".into(),
                    "copy".into(),
                    "--max-freeze".into(),
                    ms,
                ]
            }
        }
    }

    /// Runs the swept command with `case`'s fault (or the census), doing what the fault does
    /// on the servers when the command reaches the point.
    async fn faulted(
        &self,
        args: &[String],
        case: Option<&Case>,
        census: Option<&Path>,
    ) -> Result<Ran, String> {
        let held = Held::new(&format!("sweep-{}", self.cases_run));
        let mut env: Vec<(&str, String)> = Vec::new();
        if let Some(file) = census {
            env.push(("SD_FAILPOINT_CENSUS", file.display().to_string()));
        }
        if let Some(case) = case {
            let stall = (lease() + Duration::from_secs(1)).as_millis();
            let action = match case.fault {
                Fault::Kill => "kill".to_owned(),
                Fault::Error => "error".to_owned(),
                Fault::Stall => format!("stall:{stall}"),
                Fault::Restart(_) | Fault::Drop(_) => held.action(),
            };
            env.push(("FAILPOINTS", format!("{}=1*return({action})", case.point)));
        }
        let server = case.and_then(|c| match c.fault {
            Fault::Restart(s) | Fault::Drop(s) => Some((c.fault, s)),
            _ => None,
        });
        let run = self.command(args, &env);
        let act = async {
            let Some((fault, server)) = server else {
                return std::future::pending().await;
            };
            // No deadline here: the command's own bounds this wait.
            while !held.is_reached() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.act(fault, server).await;
            held.release();
            std::future::pending::<()>().await
        };
        tokio::select! {
            ran = run => Ok(ran),
            () = act => unreachable!("pending"),
        }
    }

    async fn act(&self, fault: Fault, server: Server) {
        let cluster = match server {
            Server::Directory => &self.t.directory,
            Server::Shard1 => self.t.shard_cluster("shard_1"),
            Server::Shard2 => self.t.shard_cluster("shard_2"),
        };
        match fault {
            Fault::Restart(_) => tokio::task::block_in_place(|| {
                cluster.crash();
                cluster.restart();
            }),
            _ => {
                let db = match server {
                    Server::Directory => crate::topology::DIRECTORY_DB,
                    _ => crate::topology::SHARD_DB,
                };
                cluster
                    .connect(db)
                    .await
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE application_name LIKE 'shard-directory%'",
                        &[],
                    )
                    .await
                    .expect("end the mover's sessions");
            }
        }
    }

    /// `shard-directory <args>` with the sweep's tuning and `env`, within the deadline.
    async fn command(&self, args: &[String], env: &[(&str, String)]) -> Ran {
        let mut c = mover_cli::command(&self.t);
        c.args(args)
            .args(tuning())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in env {
            c.env(k, v);
        }
        let child = c.spawn().expect("run shard-directory");
        let out = tokio::time::timeout(COMMAND_DEADLINE, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("shard-directory {args:?} ran past {COMMAND_DEADLINE:?}"))
            .expect("wait for shard-directory");
        let stdout = mover_cli::text(&out.stdout);
        if std::env::var_os("SD_SWEEP_VERBOSE").is_some() {
            println!(
                "  $ shard-directory {} {env:?}\n    exit {:?}\n    {}\n    {}",
                args.join(" "),
                out.status.code(),
                stdout.replace('\n', " "),
                mover_cli::text(&out.stderr).replace('\n', "\n    ")
            );
        }
        Ran {
            args: args.to_vec(),
            code: out.status.code(),
            json: serde_json::from_str(&stdout).ok(),
            stderr: mover_cli::text(&out.stderr),
        }
    }

    /// Invariant 2: what the command said agrees with the directory now.
    async fn reported(&self, ran: &Ran) -> Result<(), String> {
        let Some(code) = ran.code else {
            return Ok(()); // killed: it said nothing
        };
        let said = |why: String| {
            format!(
                "invariant 2 (what is reported is what happened): shard-directory {:?} exited \
                 {code}: {why}\n  its stdout: {}\n  its stderr: {}",
                ran.args,
                ran.json.as_ref().map_or("-".into(), |j| j.to_string()),
                ran.stderr.trim()
            )
        };
        let json = ran
            .json
            .as_ref()
            .ok_or_else(|| said("no JSON on stdout".into()))?;
        if json.get("batch_id").is_some() {
            return self.batch_reported(code, json).await.map_err(said);
        }
        let move_id = json["move_id"].as_i64();
        let Some(move_id) = move_id else {
            return match json["left"].as_str() {
                Some("untouched") if code == 1 => Ok(()),
                _ => Err(said("no move_id".into())),
            };
        };
        let (phase, source, target, entity) = self.record(move_id).await;
        let entry = self.t.entry("tenant", &entity).await;
        let on = |shard: &str| entry == (shard.to_owned(), "active".to_owned());
        let open = !["done", "aborted", "reverted", "reversible"].contains(&phase.as_str());
        match (code, json["left"].as_str()) {
            (0, None) => {
                let p = json["phase"].as_str().unwrap_or("?");
                let ok = match p {
                    "done" | "reversible" => on(&target) && phase == p,
                    "aborted" => ran.args[0] == "abort" && on(&source) && phase == "aborted",
                    _ => false,
                };
                ok.then_some(()).ok_or_else(|| {
                    said(format!(
                        "it said {p}; the record is {phase}, the entry {entry:?}"
                    ))
                })
            }
            (1, Some("aborted")) => (on(&source) && phase == "aborted")
                .then_some(())
                .ok_or_else(|| said(format!("the record is {phase}, the entry {entry:?}"))),
            (3, Some("released")) => (on(&source) && open)
                .then_some(())
                .ok_or_else(|| said(format!("the record is {phase}, the entry {entry:?}"))),
            (3, Some("resumable")) => open
                .then_some(())
                .ok_or_else(|| said(format!("the record is {phase}, the entry {entry:?}"))),
            (1, Some("untouched")) => Ok(()),
            (4, _) => Ok(()),
            _ => Err(said(format!(
                "an exit code and outcome that do not go together (record {phase}, entry \
                 {entry:?})"
            ))),
        }
    }

    /// A batch's report (`move --from-file`, `batch resume`): each move's outcome, why its runner
    /// stopped, and the exit code, against the directory.
    async fn batch_reported(&self, code: i32, json: &Value) -> Result<(), String> {
        let Some(batch) = json["batch_id"].as_i64() else {
            // Not recorded: nothing changed, and it says so.
            return (code == 1 && json["left"] == "untouched")
                .then_some(())
                .ok_or_else(|| "no batch, yet not untouched".into());
        };
        let state: String = self
            .t
            .dba()
            .await
            .query_one(
                "SELECT state FROM shard_directory.shard_move_batches WHERE batch_id = $1",
                &[&batch],
            )
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        // The runner stopped (or never ran): the batch is left running, to resume.
        let stopped = !json["stopped"].is_null() || json["left"] == "resumable";
        if stopped && state != "running" {
            return Err(format!("its runner stopped, but batch {batch} is {state}"));
        }
        let mut worst = if stopped { 3 } else { 0 };
        for m in json["moves"].as_array().into_iter().flatten() {
            let (id, to, from) = (
                m["entity_id"].as_str().unwrap_or("?"),
                m["to"].as_str().unwrap_or("?"),
                m["from"].as_str().unwrap_or("?"),
            );
            let entry = self.t.entry("tenant", id).await;
            match m["outcome"].as_str() {
                Some("moved") if entry != (to.to_owned(), "active".to_owned()) => {
                    return Err(format!("{id} reported moved, its entry is {entry:?}"))
                }
                Some("failed") if !m["resumable"].as_bool().unwrap_or(false) => {
                    worst = worst.max(1);
                    if entry == (to.to_owned(), "active".to_owned()) && entry.0 != from {
                        return Err(format!("{id} reported failed for good, but it is on {to}"));
                    }
                }
                Some("failed") => worst = worst.max(3),
                _ => {}
            }
        }
        if code == 0 && worst != 0 || code != 0 && code != worst && code != 4 {
            return Err(format!("exit {code} for outcomes as bad as {worst}"));
        }
        if state == "done" && worst != 0 {
            return Err(format!("batch {batch} is done while a move failed"));
        }
        Ok(())
    }

    /// `(phase, source, target, entity_id)` of move `id`.
    async fn record(&self, id: i64) -> (String, String, String, String) {
        let r = self
            .t
            .dba()
            .await
            .query_one(
                "SELECT phase, source_shard, target_shard, entity_id \
                 FROM shard_directory.shard_moves WHERE move_id = $1",
                &[&id],
            )
            .await
            .expect("the move's record");
        (r.get(0), r.get(1), r.get(2), r.get(3))
    }

    /// Ends whatever the case left open, as a person would: `resume` (or, with `abort_it`,
    /// `abort`) each open move of the tenant until none is; a batch is resumed or aborted; a
    /// reversible move is finalized. Every command's report is checked too.
    async fn finish(&self, scenario: Scenario, tenant: &str, abort_it: bool) -> Result<(), String> {
        if scenario == Scenario::Batch {
            let open: Option<i64> = self
                .t
                .dba()
                .await
                .query_one(
                    "SELECT max(batch_id) FROM shard_directory.shard_move_batches \
                     WHERE state IN ('running', 'paused', 'aborting')",
                    &[],
                )
                .await
                .map_err(|e| e.to_string())?
                .get(0);
            if let Some(batch) = open {
                let verb = if abort_it { "abort" } else { "resume" };
                let ran = self
                    .command(&["batch".into(), verb.into(), batch.to_string()], &[])
                    .await;
                if verb == "resume" {
                    self.reported(&ran).await?;
                }
            }
        }
        for attempt in 0..4 {
            let Some((id, phase)) = mover_cli::open_phase(&self.t, tenant).await else {
                break;
            };
            let verb = if abort_it && phase.can_abort() && attempt < 2 {
                "abort"
            } else {
                "resume"
            };
            let ran = self.command(&[verb.into(), id.to_string()], &[]).await;
            self.reported(&ran).await?;
            if attempt == 3 {
                return Err(format!("move {id} still open after {verb}: {ran:?}"));
            }
        }
        let reversible: Option<i64> = self
            .t
            .dba()
            .await
            .query_opt(
                "SELECT move_id FROM shard_directory.shard_moves \
                 WHERE entity_id = $1 AND phase = 'reversible'",
                &[&tenant],
            )
            .await
            .map_err(|e| e.to_string())?
            .map(|r| r.get(0));
        if let Some(id) = reversible {
            let ran = self
                .command(&["finalize".into(), id.to_string()], &[])
                .await;
            self.reported(&ran).await?;
            if ran.code != Some(0) {
                return Err(format!("finalize {id}: {ran:?}"));
            }
        }
        Ok(())
    }

    /// Invariant 3, and what the move must not leave behind.
    async fn exactly_once(&self, tenant: &str, ledger: &Ledger) -> Result<(), String> {
        let t = &self.t;
        let (shard, state) = t.entry("tenant", tenant).await;
        let broke = |why: String| format!("invariant 3 (rows exactly once): {why}");
        if state != "active" {
            return Err(broke(format!("the tenant's entry is {state} on {shard}")));
        }
        let audit = Audit::of(t, ledger).await;
        let mine = |v: &[String]| -> Vec<String> {
            v.iter()
                .filter(|s| s.contains(&format!("of {tenant} on")) || ledger.acked.contains_key(*s))
                .cloned()
                .collect()
        };
        let problems = (
            mine(&audit.lost),
            mine(&audit.misplaced),
            audit
                .duplicated
                .iter()
                .filter(|d| ledger.acked.contains_key(d.split(':').next().unwrap_or("")))
                .cloned()
                .collect::<Vec<_>>(),
            mine(&audit.without_line),
        );
        if !(problems.0.is_empty()
            && problems.1.is_empty()
            && problems.2.is_empty()
            && problems.3.is_empty())
        {
            return Err(broke(format!(
                "on {shard}: lost {:?}; misplaced {:?}; duplicated {:?}; without their line {:?}",
                problems.0, problems.1, problems.2, problems.3
            )));
        }
        let other = if shard == "shard_1" {
            "shard_2"
        } else {
            "shard_1"
        };
        let left = t.rows(other, tenant).await;
        if left != (0, 0) {
            return Err(broke(format!(
                "{left:?} rows of the tenant left on {other}"
            )));
        }
        let ids: Vec<i64> = t
            .dba()
            .await
            .query(
                "SELECT move_id FROM shard_directory.shard_moves WHERE entity_id = $1",
                &[&tenant],
            )
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let objects: Vec<String> = t
            .replication_objects()
            .await
            .into_iter()
            .filter(|o| {
                ids.iter().any(|id| {
                    o.ends_with(&format!("sd_move_{id}")) || o.contains(&format!("sd_move_{id}_"))
                })
            })
            .collect();
        if !objects.is_empty() {
            return Err(format!(
                "replication objects of the tenant's moves left: {objects:?}"
            ));
        }
        Ok(())
    }
}

fn lease() -> Duration {
    MAX_FREEZE + LEASE_GRACE
}

/// One writer of one tenant through a router: every write acknowledged or not, and when each
/// committed write ended.
struct Writer {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    state: Arc<Mutex<Written>>,
}

#[derive(Default)]
struct Written {
    ledger: Ledger,
    last_commit: Option<Instant>,
    longest_gap: Duration,
}

impl Writer {
    async fn start(t: &Topology, tenant: &str, seeded: &[String]) -> Writer {
        let router: Router = t.connected_router().await;
        let state = Arc::new(Mutex::new(Written::default()));
        {
            let mut s = state.lock().unwrap();
            for item in seeded {
                s.ledger.acked.insert(item.clone(), tenant.to_owned());
            }
            s.last_commit = Some(Instant::now());
        }
        let (stop, stopped) = watch::channel(false);
        let (tenant, shared) = (tenant.to_owned(), state.clone());
        let task = tokio::spawn(async move {
            let mut n = 0;
            while !*stopped.borrow() {
                n += 1;
                let item = format!("{tenant}-{n}");
                let wrote = write_order(&router, &tenant, &item).await;
                {
                    let mut s = shared.lock().unwrap();
                    match wrote {
                        Ok(()) => {
                            let now = Instant::now();
                            if let Some(last) = s.last_commit {
                                s.longest_gap = s.longest_gap.max(now - last);
                            }
                            s.last_commit = Some(now);
                            s.ledger.acked.insert(item, tenant.clone());
                        }
                        Err(_) => {
                            s.ledger.unacked.insert(item, tenant.clone());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Writer { stop, task, state }
    }

    /// Waits until a write commits after `since`, for up to `deadline`.
    async fn writes_again_after(&self, since: Instant, deadline: Duration) -> Result<(), String> {
        let wrote = crate::within(deadline, || async {
            self.state
                .lock()
                .unwrap()
                .last_commit
                .filter(|at| *at > since)
                .map(|_| ())
        })
        .await;
        wrote.ok_or_else(|| {
            format!("no write committed within {deadline:?} after the command ended")
        })
    }

    /// Stops the writer; its ledger and the longest time it went without a commit.
    async fn stop(self) -> (Ledger, Duration) {
        self.stop.send(true).expect("the writer runs");
        self.task.await.expect("the writer panicked");
        let s = Arc::try_unwrap(self.state)
            .unwrap_or_else(|_| panic!("the writer is done"))
            .into_inner()
            .unwrap();
        (s.ledger, s.longest_gap)
    }
}

/// Which of `cases` to run: all of them with `SD_SWEEP=all`; those named by
/// `SD_SWEEP_CASE=<scenario>/<point>/<fault>,...`; otherwise the rotating share for CI, one case in
/// `SD_SWEEP_STRIDE` (default 8), rotated by `SD_SWEEP_ROTATION` (default: the day).
pub fn select(cases: Vec<Case>) -> (Vec<Case>, String) {
    if let Ok(named) = std::env::var("SD_SWEEP_CASE") {
        let wanted: Vec<&str> = named.split(',').collect();
        let chosen = cases
            .into_iter()
            .filter(|c| wanted.contains(&c.to_string().as_str()))
            .collect();
        return (chosen, format!("SD_SWEEP_CASE={named}"));
    }
    if std::env::var("SD_SWEEP").as_deref() == Ok("all") {
        return (cases, "SD_SWEEP=all".into());
    }
    let stride: usize = std::env::var("SD_SWEEP_STRIDE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        / 86_400;
    let rotation: usize = std::env::var("SD_SWEEP_ROTATION")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(day as usize % stride);
    let chosen = cases
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % stride == rotation % stride)
        .map(|(_, c)| c)
        .collect();
    (
        chosen,
        format!(
            "SD_SWEEP_STRIDE={stride} SD_SWEEP_ROTATION={}",
            rotation % stride
        ),
    )
}

/// Every case of the census: each point each scenario reached, with every fault.
pub fn cases(census: &BTreeMap<Scenario, Vec<String>>) -> Vec<Case> {
    let mut cases = Vec::new();
    for scenario in SCENARIOS {
        for point in census.get(&scenario).into_iter().flatten() {
            for fault in FAULTS {
                cases.push(Case {
                    scenario,
                    point: point.clone(),
                    fault,
                });
            }
        }
    }
    cases
}
