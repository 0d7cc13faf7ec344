//! Runs the conformance scenarios against a client's driver:
//! `shard-directory-conformance --driver "python3 -m shard_directory.conformance"`; or, with
//! `--fleet`, lends a client's own tests a fleet of the same throwaway clusters.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Runs the scenarios, each on a fleet of its own, one after the other; exits 1 if any failed.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// The driver, run by `sh -c`: JSON lines on its stdin and stdout (conformance/README.md).
    #[arg(long, required_unless_present = "fleet")]
    driver: Option<String>,
    /// Instead of the scenarios: a directory and this many shards, for a client's own tests.
    /// Prints `{"directory": conninfo, "shards": {"shard_1": conninfo, ...}}` (as the superuser)
    /// on one line once they are up, and stops them when stdin ends.
    #[arg(long, conflicts_with = "driver")]
    fleet: Option<usize>,
    /// Only the scenarios whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Another folder of scenarios than the shipped one.
    #[arg(long)]
    scenarios: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let driver = match (cli.driver, cli.fleet) {
        (_, Some(shards)) => {
            shard_directory_conformance::fleet::lend(shards).await;
            return ExitCode::SUCCESS;
        }
        (Some(driver), None) => driver,
        (None, None) => unreachable!("clap requires --driver without --fleet"),
    };
    let dir = cli
        .scenarios
        .unwrap_or_else(shard_directory_conformance::shipped);
    let scenarios = match shard_directory_conformance::load(&dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut failed = 0;
    for s in scenarios.iter().filter(|s| {
        cli.only
            .as_ref()
            .is_none_or(|o| s.name.contains(o.as_str()))
    }) {
        match shard_directory_conformance::run(s, &driver).await {
            Ok(()) => println!("ok   {}", s.name),
            Err(e) => {
                failed += 1;
                println!("FAIL {e}");
            }
        }
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
