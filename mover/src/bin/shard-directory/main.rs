//! `shard-directory`: moves tenants between shards and shows where they are and have been.
//!
//! Exit codes, for scripts: 0 done; 1 failed, and nothing changed or the move was aborted back to
//! its start; 2 bad usage or configuration; 3 failed and left resumable (`resume` continues it,
//! or `abort` finishes undoing it); 4 busy (another process runs the move); 5 `verify` found rows
//! out of place or differing.
//!
//! SIGINT or SIGTERM during `move` or `resume` stops the run: before the cutover the move is
//! aborted (the entity writable on its source again), after it the move is finished.

use std::collections::HashMap;
use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use clap::{Parser, Subcommand, ValueEnum};

mod many;
use futures_util::future::BoxFuture;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::json;
use shard_directory_mover::{
    with_password, Error, Failure, Left, MethodChoice, MoveOptions, MoveRecord, Mover, Observer,
    Overrides, Phase,
};
use shard_directory_protocol::EntityKey;

#[derive(Parser)]
#[command(
    name = "shard-directory",
    version,
    about = "Move entities between shard_directory shards"
)]
struct Cli {
    /// The directory database (libpq connection string or URI, no password: .pgpass or PGPASSWORD).
    #[arg(long, env = "SHARD_DIRECTORY_URL", global = true)]
    directory: Option<String>,
    /// TOML file overriding shards' connection strings ([shards.<name>] conninfo, replication_conninfo).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(flatten)]
    tuning: Tuning,
    #[command(subcommand)]
    command: Command,
}

/// How long the steps of `move`, `resume` and `abort` may wait, and how much they do at once.
#[derive(clap::Args)]
struct Tuning {
    /// Longest time the initial copy, and the catch-up before the freeze, may take (a copy paced
    /// by --max-rate or --max-lag takes as long as its pace needs).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30m", global = true)]
    sync_timeout: Duration,
    /// Rows deleted per transaction when clearing a shard of the entity's rows.
    #[arg(long, default_value_t = 10_000, global = true)]
    delete_batch: i64,
    /// How long a fence change (or the replication slot) may keep waiting behind a shard's
    /// transactions in flight.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s", global = true)]
    fence_wait: Duration,
    /// WAL the move's slot may keep on the source, in bytes (suffixes kB, MB, GB); past it the
    /// move is undone.
    #[arg(long, value_parser = parse_bytes, default_value = "1GB", global = true)]
    max_slot_lag: i64,
    /// At most this many rows a second: copied by the logical method's initial copy (which the
    /// mover then makes itself), and deleted when a move clears a shard of its entity's rows
    /// (the source's after the cutover; the target's on an abort).
    #[arg(long, value_name = "ROWS", global = true)]
    max_rate: Option<u64>,
    /// While the written shard's standbys replay more than this far behind (e.g. 64MB), that
    /// copy or delete waits. Needs pg_read_all_stats to see their positions.
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES", global = true)]
    max_lag: Option<i64>,
    /// How much longer than --max-freeze a freeze holds when no mover ends it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s", global = true)]
    lease_grace: Duration,
    /// How long a move, or a batch's runner, keeps trying to reach its directory again when it
    /// stops answering (a crash, a failover: give the directory's hosts as host=a,b
    /// target_session_attrs=read-write), then goes on from its record. 0s: it stops, resumable.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s", global = true)]
    directory_patience: Duration,
    /// Print the result as JSON on stdout (move, resume, abort, purge-source).
    #[arg(long, global = true)]
    json: bool,
    /// Serve the moves' metrics (phases, freezes, rows, lag, retained WAL) as Prometheus text
    /// at http://ADDR/metrics while the command runs.
    #[arg(long, value_name = "ADDR", global = true)]
    metrics_addr: Option<std::net::SocketAddr>,
}

fn parse_bytes(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: i64 = number.parse().map_err(|_| format!("{s}: not a size"))?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        other => return Err(format!("{s}: unknown unit {other} (B, kB, MB, GB, TB)")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{s}: too large"))
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum MethodArg {
    Auto,
    Logical,
    Copy,
}

impl From<MethodArg> for MethodChoice {
    fn from(m: MethodArg) -> MethodChoice {
        match m {
            MethodArg::Auto => MethodChoice::Auto,
            MethodArg::Logical => MethodChoice::Logical,
            MethodArg::Copy => MethodChoice::Copy,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Move an entity to another shard, with its rows.
    Move {
        #[arg(required_unless_present = "from_file")]
        entity_type: Option<String>,
        #[arg(required_unless_present = "from_file")]
        entity_id: Option<String>,
        /// The target shard.
        #[arg(long, required_unless_present = "from_file")]
        to: Option<String>,
        /// Run the moves of a plan file (`drain`, `split` and `rebalance` write them; a person
        /// may edit one); run again after an interruption, it goes on where it stopped.
        #[arg(long, value_name = "PLAN", conflicts_with_all = ["entity_type", "entity_id", "to", "dry_run"])]
        from_file: Option<PathBuf>,
        #[command(flatten)]
        batch: many::BatchArgs,
        #[arg(long, value_enum, default_value = "auto")]
        method: MethodArg,
        /// Longest time the entity's writes may be refused; past it the move aborts itself.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
        max_freeze: Duration,
        /// Leave the entity's rows on the source (fenced, unreachable through the directory);
        /// `purge-source` deletes them later.
        #[arg(long)]
        keep_source: bool,
        /// Keep a way back after the cutover: the entity's rows replicate from the target back
        /// to the source (kept there, fenced) until `finalize`; `revert` moves it back with only
        /// a short freeze. Needs the logical method's settings the other way round too.
        #[arg(long)]
        reversible: bool,
        /// With --reversible: how long the way back is kept; past it, `finalize --expired`
        /// finalizes the move (run it from cron).
        #[arg(long, value_parser = humantime::parse_duration, requires = "reversible")]
        reversible_for: Option<Duration>,
        /// Method logical: compare every row under the freeze instead of online (then, under
        /// the freeze, only the rows changed since); needs no slot or publication on the target.
        #[arg(long)]
        no_online_check: bool,
        /// Method logical: freezes tried when one runs past --max-freeze (each undone, the copy
        /// kept) before the move aborts.
        #[arg(long, default_value_t = 3)]
        freeze_attempts: u32,
        /// Check everything and print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// A table (schema.table) whose column named like the key does not hold entity ids
        /// (repeatable); preflight otherwise refuses to move while it is not protected.
        #[arg(long = "unrelated-table", value_name = "TABLE")]
        unrelated_tables: Vec<String>,
    },
    /// Move every entity off a shard: prints the plan (JSON); --apply runs it.
    Drain {
        shard: String,
        /// The shards to move them to, comma-separated (default: every other shard).
        #[arg(long, value_delimiter = ',')]
        to: Vec<String>,
        #[command(flatten)]
        plan: many::PlanArgs,
    },
    /// Move about a fraction of a shard's weight to another shard: prints the plan; --apply runs
    /// it.
    Split {
        shard: String,
        /// The shard that takes the moved entities.
        #[arg(long)]
        to: String,
        /// The share of the shard's weight to move (between 0 and 1).
        #[arg(long, default_value_t = 0.5)]
        fraction: f64,
        #[command(flatten)]
        plan: many::PlanArgs,
    },
    /// Even out the shards' weights: prints the plan; --apply runs it.
    Rebalance {
        /// How far above the mean a shard may stay (a fraction of the mean).
        #[arg(long, default_value_t = 0.1)]
        tolerance: f64,
        /// The most moves the plan makes.
        #[arg(long, default_value_t = 100)]
        max_moves: usize,
        #[command(flatten)]
        plan: many::PlanArgs,
    },
    /// A batch of moves (`move --from-file`, `--apply`): status, pause, resume, abort.
    Batch {
        #[command(subcommand)]
        what: BatchWhat,
    },
    /// Continue a move from where it stopped.
    Resume { move_id: i64 },
    /// Move the entity of a reversible move back where it came from (only a short freeze).
    Revert { move_id: i64 },
    /// End a reversible move where it is: drop its way back, delete the source's rows.
    Finalize {
        #[arg(required_unless_present = "expired", conflicts_with = "expired")]
        move_id: Option<i64>,
        /// Every reversible move whose --reversible-for has run out.
        #[arg(long)]
        expired: bool,
    },
    /// Return a move to its start (not once it has passed complete_move).
    Abort { move_id: i64 },
    /// One move (with who drives it and what its slot keeps), or the open ones.
    Status { move_id: Option<i64> },
    /// Every move, newest first.
    List {
        /// Only the moves not finished yet.
        #[arg(long)]
        open: bool,
        /// Only the moves started at or after this time (any timestamptz PostgreSQL reads).
        #[arg(long)]
        since: Option<String>,
    },
    /// Which shard holds an entity (now, or at a time).
    Where {
        entity_type: String,
        entity_id: String,
        /// Any timestamptz PostgreSQL reads, e.g. '2026-03-15 12:00+00'.
        #[arg(long)]
        at: Option<String>,
    },
    /// Every change of an entity's directory entry.
    History {
        entity_type: String,
        entity_id: String,
    },
    /// Drop replication objects left behind by finished or aborted moves.
    Cleanup,
    /// Republish the directory's changes to the clients through Redis pub/sub, sealed with a
    /// shared key, from one directory session; runs until stopped.
    Relay {
        /// The Redis to publish to: redis://[user:password@]host:port/db, a user allowed to
        /// PUBLISH on the channel.
        #[arg(long, env = "SHARD_DIRECTORY_RELAY_REDIS")]
        redis: String,
        /// The pub/sub channel (the clients' RelayConfig::channel).
        #[arg(long, default_value = "shard_directory")]
        channel: String,
        /// A file holding the key the messages are sealed with (without a trailing newline; the
        /// clients' RelayConfig::key).
        #[arg(long)]
        key_file: PathBuf,
        /// How often the relay reads and publishes the version when nothing is notified (the
        /// clients take the relay for gone after a few missed).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
        heartbeat: Duration,
    },
    /// Delete the rows a finished `move --keep-source` left on its source.
    PurgeSource { move_id: i64 },
    /// Reconcile without moving (exit 5 when something is found).
    Verify {
        #[command(subcommand)]
        what: VerifyWhat,
    },
}

#[derive(Subcommand)]
enum BatchWhat {
    /// The batch and where each of its moves stands.
    Status { batch_id: i64 },
    /// Start no more of its moves; those under way go on to their end.
    Pause { batch_id: i64 },
    /// Run it again from where it stopped (paused, or its runner killed).
    Resume { batch_id: i64 },
    /// Abort its open moves (finish those past their cutover) and start no more.
    Abort { batch_id: i64 },
}

#[derive(Subcommand)]
enum VerifyWhat {
    /// Rows on a shard of entities the directory places elsewhere (or nowhere).
    Shard {
        shard: String,
        /// Only this entity type (default: every type protected on the shard).
        #[arg(long)]
        entity_type: Option<String>,
    },
    /// One entity's rows on the shard the directory names, compared with another shard's.
    Entity {
        entity_type: String,
        entity_id: String,
        /// The shard to compare with.
        #[arg(long)]
        against: String,
    },
}

/// Progress bars on a terminal, plain lines otherwise: one per phase, per finished table, per
/// change of the replication lag (at most one a second).
struct Progress {
    bars: Option<MultiProgress>,
    /// A bar per table of each move (a plan runs several at once).
    tables: Mutex<HashMap<(i64, String), ProgressBar>>,
    lag_shown: Mutex<Option<(Instant, i64)>>,
    /// The move this process runs, once it has an id.
    move_id: Mutex<Option<i64>>,
    /// Its phase, as last reported.
    phase: Mutex<Option<Phase>>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            bars: std::io::stderr().is_terminal().then(MultiProgress::new),
            tables: Mutex::default(),
            lag_shown: Mutex::default(),
            move_id: Mutex::default(),
            phase: Mutex::default(),
        }
    }

    fn line(&self, message: &str) {
        let stamp = humantime::format_rfc3339_millis(SystemTime::now());
        match &self.bars {
            Some(bars) => {
                let _ = bars.println(message);
            }
            None => eprintln!("{stamp} {message}"),
        }
    }

    fn move_id(&self) -> Option<i64> {
        *self.move_id.lock().expect("progress lock")
    }
}

impl Observer for Progress {
    fn phase(&self, move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        *self.move_id.lock().expect("progress lock") = Some(move_id);
        *self.phase.lock().expect("progress lock") = Some(phase);
        self.line(&format!("move {move_id}: {phase}"));
        Box::pin(std::future::ready(()))
    }

    fn rows(&self, move_id: i64, table: &str, done: i64, total: i64) {
        let Some(bars) = &self.bars else {
            if done == total {
                self.line(&format!("move {move_id}: {table}: {done}/{total} rows"));
            }
            return;
        };
        let mut tables = self.tables.lock().expect("progress lock");
        let bar = tables
            .entry((move_id, table.to_owned()))
            .or_insert_with(|| {
                let bar = bars.add(ProgressBar::new(total.max(0) as u64));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix:>24} [{bar:30}] {pos}/{len} rows, {per_sec}, eta {eta}",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                );
                bar.set_prefix(format!("{move_id} {table}"));
                bar
            });
        bar.set_length(total.max(done).max(0) as u64);
        bar.set_position(done.max(0) as u64);
    }

    fn lag(&self, move_id: i64, bytes: i64) {
        let mut shown = self.lag_shown.lock().expect("progress lock");
        if shown.is_some_and(|(at, last)| last == bytes || at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *shown = Some((Instant::now(), bytes));
        self.line(&format!("move {move_id}: replication lag {bytes} bytes"));
    }

    fn note(&self, move_id: i64, message: &str) {
        self.line(&format!("move {move_id}: {message}"));
    }
}

/// A move in lines; `streaming`, when known (`status` of one move reads its slot), whether a
/// reversible move's way back streams.
fn summary(r: &MoveRecord, streaming: Option<bool>) -> String {
    let freeze = r.freeze_time().map_or("-".to_owned(), |d| {
        humantime::format_duration(d).to_string()
    });
    let mut s = format!(
        "move {} {}: {}/{} {} -> {} by {}, cutover version {}, freeze {freeze}",
        r.move_id,
        r.phase,
        r.entity_type,
        r.entity_id,
        r.source_shard,
        r.target_shard,
        r.method.as_str(),
        r.cutover_version.map_or("-".to_owned(), |v| v.to_string()),
    );
    for (table, p) in &r.tables {
        s.push_str(&format!(
            "\n  {table}: {} rows, copied {}, verified {}, deleted on source {}",
            p.rows,
            p.copied,
            p.verified.map_or("-".to_owned(), |v| v.to_string()),
            p.deleted
        ));
        if let (Some(rate), Some(eta), false) =
            (p.rows_per_second, p.eta_seconds, r.phase.is_finished())
        {
            s.push_str(&format!(" ({rate} rows/s, {eta} s left)"));
        }
    }
    if r.phase == Phase::Reversible {
        let until = r
            .reversible_until
            .as_deref()
            .map_or(String::new(), |u| format!(" until {u}"));
        let way_back = match streaming {
            Some(true) => format!("its rows stream back to {}", r.source_shard),
            Some(false) => format!(
                "its way back to {} is not streaming: {}'s rows fall behind until it streams \
                 again, and {} keeps the WAL it needs",
                r.source_shard, r.source_shard, r.target_shard
            ),
            None => format!("a way back keeps {}'s rows", r.source_shard),
        };
        s.push_str(&format!(
            "\n  reversible{until}: {way_back}; `revert {}` takes it back, `finalize {}` ends that",
            r.move_id, r.move_id
        ));
    }
    if let Some(reversible) = r.reverses {
        s.push_str(&format!("\n  reverts move {reversible}"));
    }
    if let Some(e) = &r.last_error {
        s.push_str(&format!("\n  last error: {e}"));
    }
    s
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("plain data serialises")
}

/// How the command ended, and the exit code that says so.
enum Outcome {
    Done,
    /// Exit code and message.
    Failed(u8, String),
    Usage(String),
}

/// The exit code of a move that failed: 4 busy, else as it was left.
fn exit_code(f: &Failure) -> u8 {
    match (&f.error, f.left) {
        (Error::Busy { .. }, _) => 4,
        (_, Left::Untouched | Left::Aborted) => 1,
        (_, Left::Resumable | Left::Released) => 3,
    }
}

/// How a failed move was left, as `--json` says it.
fn left_name(left: Left) -> &'static str {
    match left {
        Left::Untouched => "untouched",
        Left::Aborted => "aborted",
        Left::Released => "released",
        Left::Resumable => "resumable",
    }
}

/// The exit code of an error that ended a command.
fn error_code(e: &Error) -> u8 {
    match e {
        Error::Config(_) => 2,
        Error::Busy { .. } | Error::BatchBusy { .. } => 4,
        // A batch's runner stopped, its moves left where they were, resumable.
        Error::BatchStopped { .. } => 3,
        _ => 1,
    }
}

impl From<Error> for Outcome {
    fn from(e: Error) -> Outcome {
        match error_code(&e) {
            2 => Outcome::Usage(e.to_string()),
            code => Outcome::Failed(code, e.to_string()),
        }
    }
}

impl From<Failure> for Outcome {
    fn from(f: Failure) -> Outcome {
        Outcome::Failed(exit_code(&f), f.to_string())
    }
}

/// A move's outcome, printed as `--json` asks: the record, or what failed and how it was left.
fn report(result: Result<MoveRecord, Failure>, as_json: bool) -> Result<(), Outcome> {
    match (result, as_json) {
        (Ok(record), false) => {
            println!("{}", summary(&record, None));
            Ok(())
        }
        (Ok(record), true) => {
            println!("{}", json(&record));
            Ok(())
        }
        (Err(failure), false) => Err(failure.into()),
        (Err(failure), true) => {
            println!(
                "{}",
                json(&json!({
                    "error": failure.error.to_string(),
                    "left": left_name(failure.left),
                    "move_id": failure.move_id,
                    "phase": failure.phase.map(|p| p.as_str()),
                    "abort_error": failure.abort_error.as_ref().map(|e| e.to_string()),
                }))
            );
            Err(failure.into())
        }
    }
}

/// Resolves when the process is asked to stop (SIGINT, SIGTERM).
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(int), Ok(term)) => (int, term),
        _ => return std::future::pending().await,
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Runs a move to its end, unless the process is asked to stop: then the run is dropped (its
/// sessions end, and its lock with them) and the move is aborted if it has not passed its
/// cutover, or finished if it has.
async fn run_to_the_end(
    mover: &Mover,
    progress: &Progress,
    key: Option<&EntityKey>,
    work: impl Future<Output = Result<MoveRecord, Failure>>,
) -> Result<MoveRecord, Failure> {
    let untouched = |e| Failure {
        move_id: None,
        error: e,
        left: Left::Untouched,
        phase: None,
        abort_error: None,
    };
    tokio::select! {
        result = work => return result,
        () = interrupted() => {}
    }
    progress.line("interrupted: stopping the move");
    let id = match progress.move_id() {
        Some(id) => Some(id),
        // Interrupted before the first phase was reported: the move may have begun all the same.
        None => match key {
            Some(key) => mover
                .list(true, None)
                .await
                .map_err(untouched)?
                .into_iter()
                .find(|r| r.entity() == *key && r.phase != Phase::Reversible)
                .map(|r| r.move_id),
            None => None,
        },
    };
    let Some(id) = id else {
        return Err(untouched(Error::Config(
            "interrupted before the move began: nothing was changed".into(),
        )));
    };
    let phase = mover.status(id).await.map_err(untouched)?.phase;
    if phase.can_abort() {
        progress.line(&format!("move {id}: aborting it (it had not cut over)"));
        let aborted = mover.abort(id).await?;
        Err(Failure {
            move_id: Some(id),
            error: Error::State {
                move_id: id,
                phase: aborted.phase,
                why: "interrupted before its cutover".into(),
            },
            left: Left::Aborted,
            phase: Some(aborted.phase),
            abort_error: None,
        })
    } else {
        progress.line(&format!(
            "move {id}: finishing it (it has cut over: only forward)"
        ));
        mover.resume(id).await
    }
}

async fn run(cli: Cli) -> Result<(), Outcome> {
    let directory = cli.directory.ok_or_else(|| {
        Outcome::Usage("give the directory database: --directory or SHARD_DIRECTORY_URL".into())
    })?;
    let directory: tokio_postgres::Config = directory
        .parse()
        .map_err(|e| Outcome::Usage(format!("--directory: {e}")))?;
    let overrides = match &cli.config {
        Some(path) => Overrides::load(path)?,
        None => Overrides::default(),
    };
    let tuning = &cli.tuning;
    if let Some(addr) = tuning.metrics_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| Outcome::Usage(format!("--metrics-addr {addr}: {e}")))?;
    }
    let mut options = MoveOptions {
        sync_timeout: tuning.sync_timeout,
        delete_batch: tuning.delete_batch,
        max_rate: tuning.max_rate,
        max_lag: tuning.max_lag,
        fence_patience: tuning.fence_wait,
        max_slot_lag: tuning.max_slot_lag,
        lease_grace: tuning.lease_grace,
        directory_patience: tuning.directory_patience,
        ..Default::default()
    };
    if let Command::Move {
        method,
        max_freeze,
        keep_source,
        reversible,
        reversible_for,
        no_online_check,
        freeze_attempts,
        unrelated_tables,
        ..
    } = &cli.command
    {
        options.unrelated_tables = unrelated_tables.clone();
        options.method = (*method).into();
        options.max_freeze = *max_freeze;
        options.keep_source = *keep_source;
        options.reversible = *reversible;
        options.reversible_for = *reversible_for;
        options.online_check = !*no_online_check;
        options.freeze_attempts = *freeze_attempts;
    }
    if let Command::Drain { plan, .. }
    | Command::Split { plan, .. }
    | Command::Rebalance { plan, .. } = &cli.command
    {
        options.method = plan.method.into();
        options.max_freeze = plan.max_freeze;
        options.sizes_max_age = plan.sizes_max_age;
    }
    let progress = std::sync::Arc::new(Progress::new());
    let mover = Mover::new(directory.clone(), overrides, options).with_observer(progress.clone());
    let as_json = tuning.json;
    match cli.command {
        Command::Move {
            from_file: Some(path),
            batch,
            ..
        } => many::run_file(&mover, &path, batch.options(), as_json).await?,
        Command::Move {
            entity_type: Some(entity_type),
            entity_id: Some(entity_id),
            to: Some(to),
            dry_run,
            ..
        } => {
            let key = EntityKey::new(entity_type, entity_id);
            if dry_run {
                println!("{}", mover.plan(&key, &to).await?);
            } else {
                let work = mover.start(&key, &to);
                report(
                    run_to_the_end(&mover, &progress, Some(&key), work).await,
                    as_json,
                )?;
            }
        }
        Command::Move { .. } => unreachable!("clap requires an entity and --to, or --from-file"),
        Command::Drain { shard, to, plan } => {
            let fleet = many::fleet(&mover, &plan).await?;
            let made = shard_directory_mover::drain(&fleet, &shard, &to, plan.by)?;
            many::plan_or_apply(&mover, made, &plan, as_json).await?
        }
        Command::Split {
            shard,
            to,
            fraction,
            plan,
        } => {
            let fleet = many::fleet(&mover, &plan).await?;
            let made = shard_directory_mover::split(&fleet, &shard, &to, fraction, plan.by)?;
            many::plan_or_apply(&mover, made, &plan, as_json).await?
        }
        Command::Rebalance {
            tolerance,
            max_moves,
            plan,
        } => {
            let fleet = many::fleet(&mover, &plan).await?;
            let made = shard_directory_mover::rebalance(&fleet, plan.by, tolerance, max_moves)?;
            many::plan_or_apply(&mover, made, &plan, as_json).await?
        }
        Command::Batch { what } => match what {
            BatchWhat::Status { batch_id } => {
                many::print_status(&mover.batch_status(batch_id).await?, as_json)
            }
            BatchWhat::Pause { batch_id } => {
                many::print_status(&mover.pause_batch(batch_id).await?, as_json)
            }
            BatchWhat::Abort { batch_id } => {
                many::print_status(&mover.abort_batch(batch_id).await?, as_json)
            }
            BatchWhat::Resume { batch_id } => match mover.resume_batch(batch_id).await {
                Ok(run) => many::report(batch_id, run, as_json)?,
                Err(e) => return Err(many::failed(Some(batch_id), e, as_json)),
            },
        },
        Command::Resume { move_id } => {
            let work = mover.resume(move_id);
            report(run_to_the_end(&mover, &progress, None, work).await, as_json)?;
        }
        Command::Revert { move_id } => {
            let key = mover.status(move_id).await?.entity();
            let work = mover.revert(move_id);
            report(
                run_to_the_end(&mover, &progress, Some(&key), work).await,
                as_json,
            )?;
        }
        Command::Finalize {
            move_id: Some(move_id),
            ..
        } => {
            let work = mover.finalize(move_id);
            report(run_to_the_end(&mover, &progress, None, work).await, as_json)?;
        }
        Command::Finalize { move_id: None, .. } => {
            // Each finalized in turn; the last failure (each printed) is the exit code.
            let mut last = Ok(());
            for result in mover.finalize_expired().await? {
                if let Err(Outcome::Failed(code, message)) = report(result, as_json) {
                    eprintln!("shard-directory: {message}");
                    last = Err(Outcome::Failed(
                        code,
                        "a move could not be finalized".into(),
                    ));
                }
            }
            last?;
        }
        Command::Abort { move_id } => report(mover.abort(move_id).await, as_json)?,
        Command::PurgeSource { move_id } => {
            let record = mover.purge_source(move_id).await?;
            if as_json {
                println!("{}", json(&record));
            } else {
                println!("{}", summary(&record, None));
            }
        }
        Command::Status { move_id } => match move_id {
            Some(id) => {
                let status = mover.status_detail(id).await?;
                if as_json {
                    println!("{}", json(&status));
                } else {
                    let streaming = status.slot.as_ref().map(|s| s.active);
                    println!("{}", summary(&status.record, streaming));
                    if let Some(d) = &status.driver {
                        println!("  driven by {d}");
                    }
                    if let Some(s) = &status.slot {
                        println!(
                            "  slot {} on {} keeps {} bytes of WAL ({}, {})",
                            s.name,
                            s.shard,
                            s.retained_wal_bytes,
                            s.wal_status.as_deref().unwrap_or("?"),
                            if s.active {
                                "streaming"
                            } else {
                                "not streaming"
                            }
                        );
                    }
                }
            }
            None => {
                let records = mover.list(true, None).await?;
                if as_json {
                    println!("{}", json(&records));
                } else if records.is_empty() {
                    println!("no open moves");
                }
                for r in records.iter().filter(|_| !as_json) {
                    println!("{}", summary(r, None));
                }
            }
        },
        Command::List { open, since } => {
            let records = mover.list(open, since.as_deref()).await?;
            if as_json {
                println!("{}", json(&records));
            }
            for r in records.iter().filter(|_| !as_json) {
                println!(
                    "{:>6}  {:<11}  {}/{}  {} -> {}  {}  started {} by {}",
                    r.move_id,
                    r.phase,
                    r.entity_type,
                    r.entity_id,
                    r.source_shard,
                    r.target_shard,
                    r.method.as_str(),
                    r.started_at,
                    r.started_by
                );
            }
        }
        Command::Where {
            entity_type,
            entity_id,
            at,
        } => {
            let key = EntityKey::new(entity_type, entity_id);
            match at {
                Some(at) => match mover.placement_at(&key, &at).await? {
                    Some(shard) => println!("{key} at {at}: {shard}"),
                    None => println!("{key} at {at}: did not exist"),
                },
                None => match mover.placement(&key).await? {
                    Some(p) => println!(
                        "{key}: {} ({}{}, version {})",
                        p.shard_name,
                        p.state,
                        p.target_shard
                            .map(|t| format!(" to {t}"))
                            .unwrap_or_default(),
                        p.version
                    ),
                    None => {
                        return Err(Outcome::Failed(1, format!("no directory entry for {key}")))
                    }
                },
            }
        }
        Command::History {
            entity_type,
            entity_id,
        } => {
            let rows = mover
                .history(&EntityKey::new(entity_type, entity_id))
                .await?;
            if as_json {
                println!("{}", json(&rows));
            }
            for h in rows.iter().filter(|_| !as_json) {
                println!(
                    "{}  v{:<6} {:<18} {} -> {} ({}{})  by {}",
                    h.changed_at,
                    h.version,
                    h.transition,
                    h.old_shard.as_deref().unwrap_or("-"),
                    h.new_shard.as_deref().unwrap_or("-"),
                    h.new_state.as_deref().unwrap_or("deleted"),
                    h.new_target
                        .as_deref()
                        .map(|t| format!(" to {t}"))
                        .unwrap_or_default(),
                    h.changed_by
                );
            }
        }
        Command::Verify {
            what: VerifyWhat::Shard { shard, entity_type },
        } => {
            let strays = mover.strays(&shard, entity_type.as_deref()).await?;
            if as_json {
                println!("{}", json(&strays));
            }
            for stray in strays.iter().filter(|_| !as_json) {
                let rows: Vec<String> = stray
                    .rows
                    .iter()
                    .map(|(t, n)| format!("{t}: {n}"))
                    .collect();
                println!(
                    "{} has rows on {} ({}), fenced {} there; the directory {}",
                    stray.entity,
                    stray.shard,
                    rows.join(", "),
                    stray.fence,
                    match &stray.placement {
                        Some(p) => format!("places it on {} ({})", p.shard_name, p.state),
                        None => "has no entry for it".to_owned(),
                    }
                );
            }
            if !strays.is_empty() {
                return Err(Outcome::Failed(
                    5,
                    format!(
                        "{} entities with rows out of place on {shard}",
                        strays.len()
                    ),
                ));
            }
            if !as_json {
                println!("every row on {shard} is where the directory says");
            }
        }
        Command::Verify {
            what:
                VerifyWhat::Entity {
                    entity_type,
                    entity_id,
                    against,
                },
        } => {
            let key = EntityKey::new(entity_type, entity_id);
            match mover.compare(&key, &against).await {
                Ok(counts) => {
                    let rows: Vec<String> =
                        counts.iter().map(|(t, n)| format!("{t}: {n}")).collect();
                    println!("{key}: the same rows on {against} ({})", rows.join(", "));
                }
                Err(e @ Error::Mismatch { .. }) => return Err(Outcome::Failed(5, e.to_string())),
                Err(e) => return Err(e.into()),
            }
        }
        Command::Relay {
            redis,
            channel,
            key_file,
            heartbeat,
        } => {
            let key = std::fs::read(&key_file)
                .map_err(|e| Outcome::Usage(format!("--key-file {}: {e}", key_file.display())))?;
            let key = key.strip_suffix(b"\n").unwrap_or(&key).to_vec();
            if key.is_empty() {
                return Err(Outcome::Usage(format!(
                    "--key-file {}: the file is empty",
                    key_file.display()
                )));
            }
            let options = shard_directory_relay::RelayOptions {
                redis,
                channel,
                key,
                heartbeat,
            };
            shard_directory_relay::relay(&with_password(directory), &options)
                .await
                .map_err(|e| Outcome::Usage(format!("--redis: {e}")))?;
        }
        Command::Cleanup => {
            let dropped = mover.cleanup().await?;
            if dropped.is_empty() {
                println!("nothing to clean up");
            }
            for d in dropped {
                println!("dropped {d}");
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // The sweep's faults, from FAILPOINTS (a build with the feature `failpoints` only).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let outcome = match run(Cli::parse()).await {
        Ok(()) => Outcome::Done,
        Err(o) => o,
    };
    match outcome {
        Outcome::Done => ExitCode::SUCCESS,
        Outcome::Failed(code, message) => {
            eprintln!("shard-directory: {message}");
            ExitCode::from(code)
        }
        Outcome::Usage(message) => {
            eprintln!("shard-directory: {message}");
            ExitCode::from(2)
        }
    }
}
