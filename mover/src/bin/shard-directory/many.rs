//! `drain`, `split`, `rebalance` and `move --from-file`: plans of many moves, printed as JSON a
//! person can read and edit, and run several moves at once.

use std::path::Path;
use std::time::Duration;

use shard_directory_mover::{
    BatchOptions, BatchPlan, BatchRun, BatchStatus, Error, Fleet, Left, MethodChoice, MoveChoices,
    Mover, Outcome as Moved, Weigh,
};

use serde_json::json;

use crate::moves::summary;
use crate::output::{error_code, exit_code, left_name, lines, pretty, Outcome, Print};
use crate::MethodArg;

/// How many moves of a plan run at once.
#[derive(clap::Args)]
pub struct BatchArgs {
    /// Moves at once.
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// Moves at once that one shard takes part in, as source or target.
    #[arg(long, default_value_t = 1)]
    per_shard: usize,
}

impl BatchArgs {
    pub fn options(&self) -> BatchOptions {
        BatchOptions {
            parallel: self.parallel,
            per_shard: self.per_shard,
        }
    }
}

/// What `drain`, `split` and `rebalance` weigh by, and what they do with the plan.
#[derive(clap::Args)]
pub struct PlanArgs {
    /// Rows, bytes (estimated from the shards), or load (checked transactions per second, from
    /// each shard's entity_stats()).
    #[arg(long, value_enum, default_value = "bytes")]
    pub by: Weigh,
    /// How the plan's moves carry the rows (`--apply`), and what their freezes are estimated by.
    #[arg(long, value_enum, default_value = "auto")]
    pub method: MethodArg,
    /// The longest freeze of one move: an entity whose move is expected to freeze longer (the
    /// copy method's, which grows with its rows) is left where it is, listed in `skipped`.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub max_freeze: std::time::Duration,
    /// Entities' rows and bytes measured within this long are read from the directory
    /// (shard_sizes) instead of the shards; 0s measures every shard again.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub sizes_max_age: std::time::Duration,
    /// Write the plan to this file instead of printing it.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
    /// Run the plan's moves now (without it, the plan is only printed or written).
    #[arg(long)]
    apply: bool,
    #[command(flatten)]
    batch: BatchArgs,
}

#[derive(clap::Subcommand)]
pub enum BatchWhat {
    /// The batch and where each of its moves stands.
    Status { batch_id: i64 },
    /// Start no more of its moves; those under way go on to their end.
    Pause { batch_id: i64 },
    /// Run it again from where it stopped (paused, or its runner killed).
    Resume { batch_id: i64 },
    /// Abort its open moves (finish those past their cutover) and start no more.
    Abort { batch_id: i64 },
}

/// `batch status|pause|abort|resume`.
pub async fn batch(mover: &Mover, what: BatchWhat, print: Print) -> Result<(), Outcome> {
    match what {
        BatchWhat::Status { batch_id } => print_status(&mover.batch_status(batch_id).await?, print),
        BatchWhat::Pause { batch_id } => print_status(&mover.pause_batch(batch_id).await?, print),
        BatchWhat::Abort { batch_id } => print_status(&mover.abort_batch(batch_id).await?, print),
        BatchWhat::Resume { batch_id } => {
            return match mover.resume_batch(batch_id).await {
                Ok(run) => report(batch_id, run, print),
                Err(e) => Err(failed(Some(batch_id), e, print)),
            }
        }
    }
    Ok(())
}

/// The fleet a plan is made from, saying (stderr) which shards' sizes were read as kept in the
/// directory.
pub async fn fleet(mover: &Mover, args: &PlanArgs) -> Result<Fleet, Outcome> {
    let fleet = mover.fleet(args.by == Weigh::Load).await?;
    for (shard, age) in &fleet.sizes_kept {
        eprintln!(
            "  {shard}: rows and bytes as measured {} ago (shard_sizes; --sizes-max-age 0s \
             measures again)",
            humantime::format_duration(Duration::from_secs(age.as_secs()))
        );
    }
    Ok(fleet)
}

/// The plan's effect on each shard, for a person (stderr).
fn describe(plan: &BatchPlan) {
    eprintln!(
        "{}: {} moves, by {:?}",
        plan.purpose,
        plan.moves.len(),
        plan.by
    );
    for (shard, t) in &plan.shards {
        eprintln!(
            "  {shard}: {} -> {} entities, {} -> {} rows, {} -> {} bytes, {:.1} -> {:.1} tx/s",
            t.entities_before,
            t.entities_after,
            t.before.rows,
            t.after.rows,
            t.before.bytes,
            t.after.bytes,
            t.before.load,
            t.after.load
        );
    }
    for s in &plan.skipped {
        eprintln!(
            "  left where it is: {}/{} on {} ({} rows): its move would freeze it for about {} ms, \
             over --max-freeze; fix: make {} logical (wal_level = logical) or raise --max-freeze",
            s.entity_type, s.entity_id, s.shard, s.rows, s.freeze_ms, s.shard
        );
    }
}

pub async fn plan_or_apply(
    mover: &Mover,
    plan: BatchPlan,
    args: &PlanArgs,
    print: Print,
) -> Result<(), Outcome> {
    describe(&plan);
    match &args.out {
        Some(path) => std::fs::write(path, pretty(&plan) + "\n").map_err(|e| {
            Outcome::Failed(1, format!("writing the plan to {}: {e}", path.display()))
        })?,
        None if !args.apply => println!("{}", pretty(&plan)),
        None => {}
    }
    if args.apply {
        run(mover, &plan, args.batch.options(), print).await?;
    }
    Ok(())
}

pub async fn run_file(
    mover: &Mover,
    path: &Path,
    options: BatchOptions,
    print: Print,
) -> Result<(), Outcome> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Outcome::Usage(format!("--from-file {}: {e}", path.display())))?;
    let plan: BatchPlan = serde_json::from_str(&text)
        .map_err(|e| Outcome::Usage(format!("--from-file {}: not a plan: {e}", path.display())))?;
    run(mover, &plan, options, print).await
}

/// Records the plan as a batch, says its id (to pause or abort it from elsewhere), and runs it.
/// Not recorded, nothing changed (exit 1); recorded, a runner that cannot go on leaves it
/// running, for `batch resume` (exit 3). Either way `--json` says so.
async fn run(
    mover: &Mover,
    plan: &BatchPlan,
    options: BatchOptions,
    print: Print,
) -> Result<(), Outcome> {
    let batch_id = match mover.record_batch(plan, options).await {
        Ok(id) => id,
        Err(e) => return Err(failed(None, e, print)),
    };
    eprintln!(
        "batch {batch_id}: {} moves; `shard-directory batch pause|abort|status {batch_id}`",
        plan.moves.len()
    );
    match mover.resume_batch(batch_id).await {
        Ok(run) => report(batch_id, run, print),
        Err(e) => Err(failed(Some(batch_id), e, print)),
    }
}

/// A batch command that stopped on `e` before any move's outcome: untouched when no batch was
/// recorded (or it had nothing to run), else left running (resumable), unless another process
/// holds it.
pub fn failed(batch_id: Option<i64>, e: Error, print: Print) -> Outcome {
    let code = match (&e, batch_id) {
        (Error::Config(_), _) => return e.into(),
        (Error::BatchBusy { .. } | Error::Busy { .. }, _) => 4,
        // Nothing to run: a batch finished, or none such.
        (Error::Preflight { .. } | Error::UnknownBatch(_), _) => 1,
        (_, Some(_)) => 3,
        (_, None) => 1,
    };
    let left = if code == 1 { "untouched" } else { "resumable" };
    let stopped = json!({"batch_id": batch_id, "error": e.to_string(), "left": left});
    print.result(&stopped, |_| String::new());
    let next = match batch_id {
        Some(id) if code == 3 => {
            format!("\nbatch {id} is left running: `shard-directory batch resume {id}` goes on")
        }
        _ => String::new(),
    };
    Outcome::Failed(code, format!("{e}{next}"))
}

/// Reports each move of batch `batch_id`'s run, and why its runner stopped if it did. The exit
/// code is the worst of the failed moves' (3 left resumable, 1 aborted or untouched, 4 busy)
/// and of the runner's stop (3: the batch is left running; 4 another runner holds it).
pub fn report(batch_id: i64, run: BatchRun, print: Print) -> Result<(), Outcome> {
    let mut code = 0;
    let (mut entries, mut said) = (Vec::new(), Vec::new());
    let not_started = match run.stopped {
        Some(_) => "not started (the runner stopped first)",
        None => "not started (the batch was paused or aborted)",
    };
    for (m, outcome) in &run.moves {
        let what = format!("{}/{} {} -> {}", m.entity_type, m.entity_id, m.from, m.to);
        let (line, mut entry) = match outcome {
            Moved::Moved(record) => (
                format!("{what}: moved\n  {}", summary(record.as_ref(), None)),
                json!({"outcome": "moved", "move_id": record.move_id}),
            ),
            Moved::Skipped(why) => (
                format!("{what}: skipped: {why}"),
                json!({"outcome": "skipped", "why": why}),
            ),
            Moved::NotStarted => (
                format!("{what}: {not_started}"),
                json!({"outcome": "not_started"}),
            ),
            Moved::Failed(failure) => {
                code = code.max(exit_code(failure));
                let resumable = matches!(failure.left, Left::Resumable | Left::Released);
                (
                    format!("{what}: failed: {failure}"),
                    json!({"outcome": "failed", "move_id": failure.move_id,
                           "error": failure.error.to_string(), "left": left_name(failure.left),
                           "resumable": resumable}),
                )
            }
        };
        entry["entity_type"] = json!(m.entity_type);
        entry["entity_id"] = json!(m.entity_id);
        entry["from"] = json!(m.from);
        entry["to"] = json!(m.to);
        entries.push(entry);
        said.push(line);
    }
    let stopped = run.stopped.as_ref().map(|e| e.to_string());
    said.push(format!(
        "batch {batch_id}: `shard-directory batch status {batch_id}` shows it"
    ));
    let report = json!({"batch_id": batch_id, "moves": entries, "stopped": stopped});
    print.result(&report, |_| said.join("\n"));
    let failed = run
        .moves
        .iter()
        .filter(|(_, o)| matches!(o, Moved::Failed(_)))
        .count();
    let mut why = Vec::new();
    if failed > 0 {
        why.push(format!(
            "{failed} of {} moves of batch {batch_id} failed; `batch resume {batch_id}` goes on",
            run.moves.len()
        ));
    }
    why.extend(stopped);
    // A runner that stopped leaves its batch running: resumable, unless another one holds it.
    let stopped_code = |e: &Error| match error_code(e) {
        4 => 4,
        _ => 3,
    };
    match run.stopped.iter().map(stopped_code).fold(code, u8::max) {
        0 => Ok(()),
        code => Err(Outcome::Failed(code, why.join("\n"))),
    }
}

/// The `move` flags a batch's moves are made with, as an operator would have typed them.
fn flags(c: &MoveChoices) -> String {
    let ms = |ms: u64| humantime::format_duration(std::time::Duration::from_millis(ms));
    let method = match c.method {
        MethodChoice::Auto => "auto",
        MethodChoice::Logical => "logical",
        MethodChoice::Copy => "copy",
    };
    let mut out = format!(" --method {method} --max-freeze {}", ms(c.max_freeze_ms));
    for (set, flag) in [
        (c.keep_source, " --keep-source"),
        (c.reversible, " --reversible"),
        (!c.online_check, " --no-online-check"),
    ] {
        if set {
            out.push_str(flag);
        }
    }
    if let Some(d) = c.reversible_for_ms {
        out.push_str(&format!(" --reversible-for {}", ms(d)));
    }
    if c.freeze_attempts != shard_directory_mover::MoveOptions::default().freeze_attempts {
        out.push_str(&format!(" --freeze-attempts {}", c.freeze_attempts));
    }
    for t in &c.unrelated_tables {
        out.push_str(&format!(" --unrelated-table {t}"));
    }
    out
}

/// A batch and each of its moves, for a person or (`--json`) a script.
pub fn print_status(status: &BatchStatus, print: Print) {
    print.result(status, |status| {
        let head = format!(
            "batch {} {}: {} ({} moves, --parallel {} --per-shard {}{}), started {} by {}",
            status.batch_id,
            status.state.as_str(),
            status.purpose,
            status.moves.len(),
            status.parallel,
            status.per_shard,
            flags(&status.move_options),
            status.started_at,
            status.started_by
        );
        let moves = status.moves.iter().map(|m| {
            let p = &m.planned;
            let id = m
                .move_id
                .map(|id| format!(" (move {id})"))
                .unwrap_or_default();
            format!(
                "  {}/{} {} -> {}: {}{id}",
                p.entity_type, p.entity_id, p.from, p.to, m.phase
            )
        });
        lines(std::iter::once(head).chain(moves))
    })
}
