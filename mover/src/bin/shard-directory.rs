//! `shard-directory`: moves tenants between shards and shows where they are and have been.
//!
//! Exit codes: 0 done; 1 failed (the message says whether the move was aborted, left resumable,
//! or never started); 2 bad usage or configuration.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use clap::{Parser, Subcommand, ValueEnum};
use futures_util::future::BoxFuture;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use shard_directory_client::EntityKey;
use shard_directory_mover::{
    Error, Failure, MethodChoice, MoveOptions, MoveRecord, Mover, Observer, Overrides, Phase,
};

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum MethodArg {
    Auto,
    Logical,
    Copy,
}

#[derive(Subcommand)]
enum Command {
    /// Move an entity to another shard, with its rows.
    Move {
        entity_type: String,
        entity_id: String,
        /// The target shard.
        #[arg(long)]
        to: String,
        #[arg(long, value_enum, default_value = "auto")]
        method: MethodArg,
        /// Longest time the entity's writes may be refused; past it the move aborts itself.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
        max_freeze: Duration,
        /// Leave the entity's rows on the source (fenced, unreachable through the directory).
        #[arg(long)]
        keep_source: bool,
        /// Check everything and print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// A table (schema.table) whose column named like the key does not hold entity ids
        /// (repeatable); preflight otherwise refuses to move while it is not protected.
        #[arg(long = "unrelated-table", value_name = "TABLE")]
        unrelated_tables: Vec<String>,
    },
    /// Continue a move from where it stopped.
    Resume { move_id: i64 },
    /// Return a move to its start (not once it has passed complete_move).
    Abort { move_id: i64 },
    /// One move, or the open ones.
    Status {
        move_id: Option<i64>,
        #[arg(long)]
        json: bool,
    },
    /// Every move, newest first.
    List {
        #[arg(long)]
        json: bool,
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
        #[arg(long)]
        json: bool,
    },
    /// Drop replication objects left behind by finished or aborted moves.
    Cleanup,
}

/// Progress bars on a terminal, plain lines otherwise.
struct Progress {
    bars: Option<MultiProgress>,
    tables: Mutex<HashMap<String, ProgressBar>>,
    lag_shown: Mutex<Option<Instant>>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            bars: std::io::stderr().is_terminal().then(MultiProgress::new),
            tables: Mutex::default(),
            lag_shown: Mutex::default(),
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
}

impl Observer for Progress {
    fn phase(&self, move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
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
        let bar = tables.entry(table.to_owned()).or_insert_with(|| {
            let bar = bars.add(ProgressBar::new(total.max(0) as u64));
            bar.set_style(
                ProgressStyle::with_template("{prefix:>24} [{bar:30}] {pos}/{len} rows")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(table.to_owned());
            bar
        });
        bar.set_length(total.max(done).max(0) as u64);
        bar.set_position(done.max(0) as u64);
    }

    fn lag(&self, move_id: i64, bytes: i64) {
        let mut shown = self.lag_shown.lock().expect("progress lock");
        if shown.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *shown = Some(Instant::now());
        self.line(&format!("move {move_id}: replication lag {bytes} bytes"));
    }

    fn note(&self, move_id: i64, message: &str) {
        self.line(&format!("move {move_id}: {message}"));
    }
}

fn summary(r: &MoveRecord) -> String {
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
    }
    if let Some(e) = &r.last_error {
        s.push_str(&format!("\n  last error: {e}"));
    }
    s
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("plain data serialises")
}

enum Outcome {
    Done,
    Failed(String),
    Usage(String),
}

impl From<Error> for Outcome {
    fn from(e: Error) -> Outcome {
        match e {
            Error::Config(_) => Outcome::Usage(e.to_string()),
            other => Outcome::Failed(other.to_string()),
        }
    }
}

impl From<Failure> for Outcome {
    fn from(f: Failure) -> Outcome {
        Outcome::Failed(f.to_string())
    }
}

async fn run(cli: Cli) -> Result<(), Outcome> {
    let directory = cli.directory.ok_or_else(|| {
        Outcome::Usage("give the directory database: --directory or SHARD_DIRECTORY_URL".into())
    })?;
    let directory = directory
        .parse()
        .map_err(|e| Outcome::Usage(format!("--directory: {e}")))?;
    let overrides = match &cli.config {
        Some(path) => Overrides::load(path)?,
        None => Overrides::default(),
    };
    let mut options = MoveOptions::default();
    if let Command::Move {
        method,
        max_freeze,
        keep_source,
        unrelated_tables,
        ..
    } = &cli.command
    {
        options.unrelated_tables = unrelated_tables.clone();
        options.method = match method {
            MethodArg::Auto => MethodChoice::Auto,
            MethodArg::Logical => MethodChoice::Logical,
            MethodArg::Copy => MethodChoice::Copy,
        };
        options.max_freeze = *max_freeze;
        options.keep_source = *keep_source;
    }
    let mover = Mover::new(directory, overrides, options)
        .with_observer(std::sync::Arc::new(Progress::new()));
    match cli.command {
        Command::Move {
            entity_type,
            entity_id,
            to,
            dry_run,
            ..
        } => {
            let key = EntityKey::new(entity_type, entity_id);
            if dry_run {
                println!("{}", mover.plan(&key, &to).await?);
            } else {
                println!("{}", summary(&mover.start(&key, &to).await?));
            }
        }
        Command::Resume { move_id } => println!("{}", summary(&mover.resume(move_id).await?)),
        Command::Abort { move_id } => println!("{}", summary(&mover.abort(move_id).await?)),
        Command::Status { move_id, json: j } => {
            let records = match move_id {
                Some(id) => vec![mover.status(id).await?],
                None => mover.list(true).await?,
            };
            match (j, move_id) {
                (true, Some(_)) => println!("{}", json(&records[0])),
                (true, None) => println!("{}", json(&records)),
                (false, _) if records.is_empty() => println!("no open moves"),
                (false, _) => {
                    for r in &records {
                        println!("{}", summary(r));
                    }
                }
            }
        }
        Command::List { json: j } => {
            let records = mover.list(false).await?;
            if j {
                println!("{}", json(&records));
            }
            for r in records.iter().filter(|_| !j) {
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
                    None => return Err(Outcome::Failed(format!("no directory entry for {key}"))),
                },
            }
        }
        Command::History {
            entity_type,
            entity_id,
            json: j,
        } => {
            let rows = mover
                .history(&EntityKey::new(entity_type, entity_id))
                .await?;
            if j {
                println!("{}", json(&rows));
            }
            for h in rows.iter().filter(|_| !j) {
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
    let outcome = match run(Cli::parse()).await {
        Ok(()) => Outcome::Done,
        Err(o) => o,
    };
    match outcome {
        Outcome::Done => ExitCode::SUCCESS,
        Outcome::Failed(message) => {
            eprintln!("shard-directory: {message}");
            ExitCode::from(1)
        }
        Outcome::Usage(message) => {
            eprintln!("shard-directory: {message}");
            ExitCode::from(2)
        }
    }
}
