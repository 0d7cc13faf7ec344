//! `shard-directory`: moves tenants between shards and shows where they are and have been.
//!
//! Exit codes, for scripts: 0 done; 1 failed, and nothing changed or the move was aborted back to
//! its start; 2 bad usage or configuration; 3 failed and left resumable (`resume` continues it,
//! or `abort` finishes undoing it); 4 busy (another process runs the move); 5 `verify` found rows
//! out of place or differing.
//!
//! SIGINT or SIGTERM during `move` or `resume` stops the run: before the cutover the move is
//! aborted (the entity writable on its source again), after it the move is finished.

mod cleanup;
mod console;
mod inspect;
mod many;
mod moves;
mod output;
mod progress;
mod relay;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use shard_directory_mover::{MethodChoice, MoveOptions, Mover, Overrides};
use shard_directory_protocol::EntityKey;

use output::{Outcome, Print};
use progress::Progress;

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
    /// Print the result as one JSON value on stdout (every command but relay).
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
        what: many::BatchWhat,
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
    Relay(relay::RelayArgs),
    /// Serve a web console: the fleet, its tenants and every move, live (read-only).
    Console(console::ConsoleArgs),
    /// Delete the rows a finished `move --keep-source` left on its source.
    PurgeSource { move_id: i64 },
    /// Reconcile without moving (exit 5 when something is found).
    Verify {
        #[command(subcommand)]
        what: VerifyWhat,
    },
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
    let print = Print::new(tuning.json);
    match cli.command {
        Command::Move {
            from_file: Some(path),
            batch,
            ..
        } => many::run_file(&mover, &path, batch.options(), print).await,
        Command::Move {
            entity_type: Some(entity_type),
            entity_id: Some(entity_id),
            to: Some(to),
            dry_run,
            ..
        } => {
            let key = EntityKey::new(entity_type, entity_id);
            moves::start(&mover, &progress, print, &key, &to, dry_run).await
        }
        Command::Move { .. } => unreachable!("clap requires an entity and --to, or --from-file"),
        Command::Drain { shard, to, plan } => {
            let fleet = many::fleet(&mover, &plan).await?;
            let made = shard_directory_mover::drain(&fleet, &shard, &to, plan.by)?;
            many::plan_or_apply(&mover, made, &plan, print).await
        }
        Command::Split {
            shard,
            to,
            fraction,
            plan,
        } => {
            let fleet = many::fleet(&mover, &plan).await?;
            let made = shard_directory_mover::split(&fleet, &shard, &to, fraction, plan.by)?;
            many::plan_or_apply(&mover, made, &plan, print).await
        }
        Command::Rebalance {
            tolerance,
            max_moves,
            plan,
        } => {
            let fleet = many::fleet(&mover, &plan).await?;
            let made = shard_directory_mover::rebalance(&fleet, plan.by, tolerance, max_moves)?;
            many::plan_or_apply(&mover, made, &plan, print).await
        }
        Command::Batch { what } => many::batch(&mover, what, print).await,
        Command::Resume { move_id } => moves::resume(&mover, &progress, print, move_id).await,
        Command::Revert { move_id } => moves::revert(&mover, &progress, print, move_id).await,
        Command::Finalize { move_id, .. } => {
            moves::finalize(&mover, &progress, print, move_id).await
        }
        Command::Abort { move_id } => moves::abort(&mover, print, move_id).await,
        Command::PurgeSource { move_id } => moves::purge_source(&mover, print, move_id).await,
        Command::Status { move_id } => inspect::status(&mover, print, move_id).await,
        Command::List { open, since } => inspect::list(&mover, print, open, since.as_deref()).await,
        Command::Where {
            entity_type,
            entity_id,
            at,
        } => {
            let key = EntityKey::new(entity_type, entity_id);
            inspect::where_is(&mover, print, &key, at.as_deref()).await
        }
        Command::History {
            entity_type,
            entity_id,
        } => inspect::history(&mover, print, &EntityKey::new(entity_type, entity_id)).await,
        Command::Verify {
            what: VerifyWhat::Shard { shard, entity_type },
        } => verify::shard(&mover, print, &shard, entity_type.as_deref()).await,
        Command::Verify {
            what:
                VerifyWhat::Entity {
                    entity_type,
                    entity_id,
                    against,
                },
        } => {
            verify::entity(
                &mover,
                print,
                &EntityKey::new(entity_type, entity_id),
                &against,
            )
            .await
        }
        Command::Relay(args) => relay::relay(directory, args).await,
        Command::Console(args) => console::console(mover, directory, args).await,
        Command::Cleanup => cleanup::cleanup(&mover, print).await,
    }
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
