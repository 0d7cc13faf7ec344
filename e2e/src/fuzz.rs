//! The shard's check under a random SQL generator: SQLsmith (Debian's `sqlsmith`) reads the
//! schema it can see and sends queries, INSERT / UPDATE / DELETE / MERGE, upserts and writing
//! CTEs, each in a transaction it rolls back, as the application role `app` with a current
//! directory version, to a shard whose protected tables take every shape the docs allow
//! (`fuzz_shard.sql`: plain, foreign-key children, partitioned by range and by list with a default
//! partition, inheritance, behind rules, views and user triggers, generated, defaulted and domain
//! keys; integer, bigint, text and uuid keys), with entities fenced `moved` and `frozen`.
//!
//! Two oracles. The server never crashes: no server process died of a signal (the server log),
//! and the postmaster never restarted. No row of a fenced entity reaches the row level: an AFTER
//! ROW trigger on every table that holds rows, named to fire after protect's and enabled ALWAYS,
//! logs a WARNING for each one, which SQLsmith's rollback cannot take back; [`FuzzShard::bypass`]
//! shows that it sees a write that passes a fence on purpose.

use std::ops::AddAssign;
use std::process::Command;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::Cluster;

/// The shard: its tables, rows, fences, the role `app` and the oracle.
const SCHEMA: &str = include_str!("fuzz_shard.sql");
const DB: &str = "fuzz";
/// What the oracle's WARNING starts with, in the server log.
const FENCED_ROW: &str = "WARNING:  SD_FUZZ_FENCED_ROW";

/// What runs: `SD_FUZZ_SEEDS` (comma-separated; default `1,2,3,4`), each for `SD_FUZZ_QUERIES`
/// statements (default 3000); with `SD_FUZZ_SECONDS`, seeds after the last one follow until that
/// long has passed (`scripts/fuzz.sh`).
pub struct Plan {
    pub seeds: Vec<u64>,
    pub queries: u64,
    pub duration: Option<Duration>,
}

impl Plan {
    pub fn from_env() -> Plan {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let seeds = var("SD_FUZZ_SEEDS").map_or_else(
            || vec![1, 2, 3, 4],
            |s| {
                s.split(',')
                    .map(|seed| seed.trim().parse().expect("SD_FUZZ_SEEDS: numbers"))
                    .collect()
            },
        );
        assert!(!seeds.is_empty(), "SD_FUZZ_SEEDS names no seed");
        Plan {
            seeds,
            queries: var("SD_FUZZ_QUERIES").map_or(3000, |q| q.parse().expect("SD_FUZZ_QUERIES")),
            duration: var("SD_FUZZ_SECONDS")
                .map(|s| Duration::from_secs(s.parse().expect("SD_FUZZ_SECONDS"))),
        }
    }

    /// The seeds to run, in order: the ones named, then (for a duration) the next ones until it
    /// has passed since `start`.
    pub fn next_seed(&self, run: usize, start: Instant) -> Option<u64> {
        match (self.seeds.get(run), self.duration) {
            (Some(seed), _) => Some(*seed),
            (None, Some(d)) if start.elapsed() < d => {
                Some(self.seeds[self.seeds.len() - 1] + (run - self.seeds.len()) as u64 + 1)
            }
            _ => None,
        }
    }
}

/// What a run counted.
#[derive(Default, Debug)]
pub struct Counts {
    /// Statements SQLsmith sent (its own count).
    pub statements: u64,
    /// Of them, those that failed (any error: most are SQLsmith's type errors).
    pub failed: u64,
}

impl AddAssign for Counts {
    fn add_assign(&mut self, other: Counts) {
        self.statements += other.statements;
        self.failed += other.failed;
    }
}

/// A cluster (library preloaded) with the fuzzed shard in its database `fuzz`.
pub struct FuzzShard {
    pub cluster: Cluster,
    started: String,
}

impl FuzzShard {
    pub async fn start(name: &str) -> FuzzShard {
        let cluster = Cluster::start(
            name,
            &[
                ("shared_preload_libraries", "shard_directory"),
                ("log_min_messages", "warning"),
                // SQLsmith's statements fail by the thousand: their text stays out of the log (a
                // crash's is logged anyway; the oracle's WARNING names its own).
                ("log_min_error_statement", "panic"),
            ],
        );
        cluster.create_database_with_extension(DB).await;
        let dba = cluster.connect(DB).await;
        dba.batch_execute(&format!("SET app.directory_version = '100';\n{SCHEMA}"))
            .await
            .expect("the fuzzed shard's schema");
        let started = started(&dba).await;
        FuzzShard { cluster, started }
    }

    /// A superuser writes a fenced entity's row past the check on purpose (as a replica session,
    /// where protect's triggers do not fire) and rolls it back: the oracle must log it.
    pub async fn bypass(&self) {
        self.cluster
            .connect(DB)
            .await
            .batch_execute(
                "BEGIN; SET LOCAL session_replication_role = replica;
                 INSERT INTO invoices VALUES (7, 1, 'past the fence on purpose'); ROLLBACK",
            )
            .await
            .expect("the deliberate bypass");
    }

    /// The oracle's reports so far: each a row of a fenced entity that reached the row level.
    pub fn fenced_rows(&self) -> Vec<String> {
        self.cluster
            .server_log()
            .lines()
            .filter(|l| l.contains(FENCED_ROW))
            .map(str::to_owned)
            .collect()
    }

    /// Server processes that died of a signal, with what each was running (the log's DETAIL),
    /// and whether the postmaster itself restarted.
    pub async fn crashes(&self) -> (Vec<String>, bool) {
        let log = self.cluster.server_log();
        let lines: Vec<&str> = log.lines().collect();
        let crashes = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.contains("was terminated by signal"))
            .map(|(i, l)| {
                let running = lines[i + 1..]
                    .iter()
                    .take_while(|next| !next.contains("LOG:") || next.contains("DETAIL:"))
                    .copied()
                    .collect::<Vec<_>>()
                    .join("\n");
                format!("{l}\n{running}")
            })
            .collect();
        let dba = crate::eventually(
            "the fuzzed shard to answer",
            Duration::from_secs(30),
            || async {
                let (c, connection) = self
                    .cluster
                    .config(DB)
                    .connect(tokio_postgres::NoTls)
                    .await
                    .ok()?;
                tokio::spawn(connection);
                Some(c)
            },
        )
        .await;
        (crashes, started(&dba).await != self.started)
    }

    /// The check's refusals so far by reason (`stats()`, every backend's: preloaded).
    pub async fn refusals(&self) -> Vec<(String, i64)> {
        self.cluster
            .connect(DB)
            .await
            .query(
                "SELECT reason, count FROM shard_directory.stats() WHERE reason <> 'checks'
                 ORDER BY reason",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// One SQLsmith run as `app`: `queries` statements from `seed`, each rolled back.
    pub fn sqlsmith(&self, seed: u64, queries: u64) -> Counts {
        let target = format!(
            "host=127.0.0.1 port={} dbname={DB} user=app",
            self.cluster.port()
        );
        let out = Command::new("sqlsmith")
            .arg(format!("--target={target}"))
            .arg(format!("--seed={seed}"))
            .arg(format!("--max-queries={queries}"))
            .args(["--verbose", "--exclude-catalog"])
            .output()
            .unwrap_or_else(|e| {
                panic!("run sqlsmith: {e} (Debian's package sqlsmith: bash scripts/setup.sh)")
            });
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "sqlsmith --seed={seed} failed: {}",
            said.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
        // Its progress: a character per statement, `.` for one that ran and a letter for one
        // that failed; then `queries: N`.
        let statements = said
            .lines()
            .filter_map(|l| l.strip_prefix("queries: "))
            .filter_map(|n| n.trim().parse().ok())
            .next_back()
            .unwrap_or_else(|| panic!("sqlsmith --seed={seed} said no count: {said}"));
        let failed = said
            .lines()
            .filter(|l| !l.is_empty() && l.bytes().all(|b| b == b'.' || b.is_ascii_alphabetic()))
            .flat_map(|l| l.bytes())
            .filter(|b| *b != b'.')
            .count() as u64;
        Counts { statements, failed }
    }
}

async fn started(c: &Client) -> String {
    c.query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .expect("pg_postmaster_start_time()")
        .get(0)
}
