//! The console's actions, served only with `--allow-actions`: a move's abort, resume, revert and
//! finalize; a batch's pause, resume and abort; a drawn plan run as a batch. Each runs through
//! the same library calls as its CLI command. A GET only shows the confirmation form; the POST of that form, with the user's
//! CSRF token (and, for a step that undoes or drops something, its confirmation box), starts
//! the action in the console's process and answers at once with the page to follow it on. Every
//! action is recorded: who asked, when, what, and how it ended, in `--audit-log` (JSON lines)
//! and on the `/actions` page.

use std::collections::VecDeque;
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use maud::{html, Markup};
use serde::Serialize;
use shard_directory_mover::{BatchOptions, BatchPlan, BatchRun, Mover, Outcome};
use tokio::sync::oneshot;

/// What can be asked of a move or a batch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Abort,
    Resume,
    Revert,
    Finalize,
    Pause,
}

impl Action {
    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "abort" => Action::Abort,
            "resume" => Action::Resume,
            "revert" => Action::Revert,
            "finalize" => Action::Finalize,
            "pause" => Action::Pause,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Abort => "abort",
            Action::Resume => "resume",
            Action::Revert => "revert",
            Action::Finalize => "finalize",
            Action::Pause => "pause",
        }
    }

    /// A step that undoes work or drops a way back: its form asks to be confirmed.
    pub fn destructive(self) -> bool {
        matches!(self, Action::Abort | Action::Revert | Action::Finalize)
    }

    /// What the confirmation page says the action does.
    pub fn what(self, target: &Target) -> String {
        match (self, target) {
            (Action::Abort, Target::Move(id)) => format!(
                "Abort move {id}: undo it, the entity writable on its source again, the target \
                 cleared of its rows (shard-directory abort {id})"
            ),
            (Action::Resume, Target::Move(id)) => format!(
                "Resume move {id} from where it stopped, run by this console's process \
                 (shard-directory resume {id})"
            ),
            (Action::Revert, Target::Move(id)) => format!(
                "Revert move {id}: the entity back to its source, over its way back \
                 (shard-directory revert {id})"
            ),
            (Action::Finalize, Target::Move(id)) => format!(
                "Finalize move {id}: drop its way back and clear the source; no revert after \
                 this (shard-directory finalize {id})"
            ),
            (Action::Pause, Target::Batch(id)) => format!(
                "Pause batch {id}: start no more of its moves (shard-directory batch pause {id})"
            ),
            (Action::Resume, Target::Batch(id)) => format!(
                "Resume batch {id}, run by this console's process (shard-directory batch resume {id})"
            ),
            (Action::Abort, Target::Batch(id)) => format!(
                "Abort batch {id}: abort its open moves and start no more (shard-directory batch abort {id})"
            ),
            (action, target) => format!("{} {target}", action.as_str()),
        }
    }
}

/// What an action is asked of.
#[derive(Clone, Copy)]
pub enum Target {
    Move(i64),
    Batch(i64),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Move(id) => write!(f, "move {id}"),
            Target::Batch(id) => write!(f, "batch {id}"),
        }
    }
}

impl Target {
    pub fn page(&self, base: &str) -> String {
        match self {
            Target::Move(id) => format!("{base}/moves/{id}"),
            Target::Batch(id) => format!("{base}/batches/{id}"),
        }
    }

    /// Whether `action` applies to this kind of target.
    pub fn takes(&self, action: Action) -> bool {
        match self {
            Target::Move(_) => action != Action::Pause,
            Target::Batch(_) => matches!(action, Action::Pause | Action::Resume | Action::Abort),
        }
    }
}

/// One recorded action.
#[derive(Clone, Serialize)]
pub struct Record {
    /// When it was asked (RFC 3339, UTC).
    pub at: String,
    pub user: String,
    pub action: &'static str,
    pub target: String,
    /// `started` (`asked`, for a plan's run), then `done`, `failed: <why>`, or for a plan's run
    /// `ended: <why>` (paused or aborted before all its moves started).
    pub outcome: String,
}

/// Where actions are recorded: the audit log (JSON lines, appended, each line written whole)
/// and the last ones in memory for `/actions`.
pub struct Audit {
    file: Option<Mutex<std::fs::File>>,
    recent: Mutex<VecDeque<Record>>,
}

const RECENT: usize = 200;

impl Audit {
    pub fn open(path: Option<&PathBuf>) -> Result<Audit, String> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("--audit-log {}: {e}", p.display()))?,
            )),
            None => None,
        };
        Ok(Audit {
            file,
            recent: Mutex::new(VecDeque::new()),
        })
    }

    pub fn record(&self, record: Record) {
        let line = serde_json::to_string(&record).expect("plain data serialises");
        tracing::info!(target: "shard_directory_console::audit", "{line}");
        if let Some(file) = &self.file {
            let mut f = file.lock().expect("audit log lock");
            if let Err(e) = writeln!(f, "{line}") {
                tracing::error!("the audit log: {e}");
            }
        }
        let mut recent = self.recent.lock().expect("audit lock");
        if recent.len() == RECENT {
            recent.pop_back();
        }
        recent.push_front(record);
    }

    pub fn recent(&self) -> Vec<Record> {
        self.recent
            .lock()
            .expect("audit lock")
            .iter()
            .cloned()
            .collect()
    }
}

/// How one action was asked: by whom, of what; each record stamped with the time it is made.
fn asked(user: String, action: &'static str, target: String) -> impl Fn(String) -> Record {
    move |outcome: String| Record {
        at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        user: user.clone(),
        action,
        target: target.clone(),
        outcome,
    }
}

/// Runs `work` on a thread of its own, as the CLI command would in its process (some of the
/// mover's futures are not `Send`); it goes on if the page that asked is closed.
fn on_own_thread<F: Future<Output = ()> + 'static>(work: impl FnOnce() -> F + Send + 'static) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => {
            std::thread::spawn(move || runtime.block_on(work()));
        }
        Err(e) => tracing::error!("an action's runtime: {e}"),
    }
}

/// How an action ended, as recorded.
fn ended(result: Result<(), String>) -> String {
    match result {
        Ok(()) => "done".into(),
        Err(why) => format!("failed: {why}"),
    }
}

/// Starts `action` on `target` for `user`, in this process; records it asked and how it ended.
pub fn start(mover: Arc<Mover>, audit: Arc<Audit>, user: String, action: Action, target: Target) {
    let asked = asked(user, action.as_str(), target.to_string());
    audit.record(asked("started".into()));
    on_own_thread(move || async move {
        let result = match (action, target) {
            (Action::Abort, Target::Move(id)) => {
                mover.abort(id).await.map(drop).map_err(|f| f.to_string())
            }
            (Action::Resume, Target::Move(id)) => {
                mover.resume(id).await.map(drop).map_err(|f| f.to_string())
            }
            (Action::Revert, Target::Move(id)) => {
                mover.revert(id).await.map(drop).map_err(|f| f.to_string())
            }
            (Action::Finalize, Target::Move(id)) => mover
                .finalize(id)
                .await
                .map(drop)
                .map_err(|f| f.to_string()),
            (Action::Pause, Target::Batch(id)) => mover
                .pause_batch(id)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            (Action::Resume, Target::Batch(id)) => mover
                .resume_batch(id)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            (Action::Abort, Target::Batch(id)) => mover
                .abort_batch(id)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            (action, target) => Err(format!("{} does not apply to {target}", action.as_str())),
        };
        audit.record(asked(ended(result)));
    });
}

/// How a batch's run ended, as recorded: `done` only when every planned move moved or was
/// skipped; `failed: ...` naming the moves that failed and the runner's stop; `ended: ...` when
/// it was paused or aborted before starting some.
fn run_outcome(batch_id: i64, run: &BatchRun) -> String {
    let what = |m: &shard_directory_mover::PlannedMove| {
        format!("{}/{} to {}", m.entity_type, m.entity_id, m.to)
    };
    let mut failed: Vec<String> = run
        .moves
        .iter()
        .filter_map(|(m, outcome)| match outcome {
            Outcome::Failed(f) => Some(format!("{} failed: {f}", what(m))),
            _ => None,
        })
        .collect();
    failed.extend(
        run.stopped
            .as_ref()
            .map(|e| format!("the runner stopped: {e}")),
    );
    let unstarted: Vec<String> = run
        .moves
        .iter()
        .filter(|(_, outcome)| matches!(outcome, Outcome::NotStarted))
        .map(|(m, _)| what(m))
        .collect();
    let status = format!("`shard-directory batch status {batch_id}` shows it");
    if !failed.is_empty() {
        format!("failed: batch {batch_id}: {}; {status}", failed.join("; "))
    } else if !unstarted.is_empty() {
        format!(
            "ended: batch {batch_id} paused or aborted before {}; {status}",
            unstarted.join(", ")
        )
    } else {
        "done".into()
    }
}

/// Runs `plan` as a new batch for `user`, as `drain|split|rebalance --apply` does: recorded
/// (the batch's id answered at once, or why it was not recorded), then run to its end in this
/// process. Recorded as asked, as started and as ended.
pub fn run_plan(
    mover: Arc<Mover>,
    audit: Arc<Audit>,
    user: String,
    plan: BatchPlan,
    options: BatchOptions,
) -> oneshot::Receiver<Result<i64, String>> {
    let (tx, rx) = oneshot::channel();
    let what = format!("{}: {} moves", plan.purpose, plan.moves.len());
    let record = asked(user.clone(), "run plan", what.clone());
    audit.record(record("asked".into()));
    on_own_thread(move || async move {
        let batch_id = match mover.record_batch(&plan, options).await {
            Ok(id) => id,
            Err(e) => {
                audit.record(record(ended(Err(e.to_string()))));
                let _ = tx.send(Err(e.to_string()));
                return;
            }
        };
        let record = asked(user, "run plan", format!("batch {batch_id} ({what})"));
        audit.record(record("started".into()));
        let _ = tx.send(Ok(batch_id));
        let outcome = match mover.resume_batch(batch_id).await {
            Ok(run) => run_outcome(batch_id, &run),
            Err(e) => ended(Err(e.to_string())),
        };
        audit.record(record(outcome));
    });
    rx
}

/// The confirmation form of `action` on `target`: a POST with the user's CSRF token.
pub fn confirm(base: &str, action: Action, target: &Target, csrf: &str) -> Markup {
    let to = format!("{}/{}", target.page(base), action.as_str());
    html! {
        p { (action.what(target)) }
        form method="post" action=(to) {
            input type="hidden" name="csrf" value=(csrf);
            @if action.destructive() {
                label { input type="checkbox" name="confirm" value="yes" required; " I mean it" }
                " "
            }
            button.action { (action.as_str()) }
        }
        p { a href=(target.page(base)) { "Back" } }
    }
}

/// The recorded actions, newest first.
pub fn page(records: &[Record]) -> Markup {
    html! {
        @if records.is_empty() {
            p.none { "No action was asked of this console since it started." }
        } @else {
            table.actions {
                thead { tr { th { "when" } th { "who" } th { "action" } th { "of" } th { "outcome" } } }
                tbody {
                    @for r in records {
                        tr {
                            td { time datetime=(r.at) title=(r.at) { (r.at) } }
                            td { (r.user) } td { (r.action) } td { (r.target) } td { (r.outcome) }
                        }
                    }
                }
            }
        }
    }
}
