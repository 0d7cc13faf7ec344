//! A scenario, as data (`conformance/scenarios/*.json`): the fleet it starts from, how the client
//! is opened, and steps that either change the fleet (SQL, a move, a server stopped) or ask the
//! client something and compare its answer with what the contract (docs/protocol.md) requires.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// One scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Its file's name without `.json`; set by [`load`].
    #[serde(skip)]
    pub name: String,
    /// What it shows, and which part of the contract it holds the client to.
    pub why: String,
    /// How many shards (`shard_1` ...), each with the suite's `orders` table protected.
    #[serde(default = "two")]
    pub shards: usize,
    /// Tenants and the shard each starts on.
    pub tenants: BTreeMap<String, String>,
    /// What stands between the client and the directory.
    #[serde(default)]
    pub fleet: Fleet,
    /// How the client is opened (the driver's `open`).
    #[serde(default)]
    pub client: ClientOptions,
    pub steps: Vec<Step>,
}

fn two() -> usize {
    2
}

/// What the client reaches the directory through, besides its own sessions.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// The directory's conninfo is a PgBouncer's in transaction mode: a LISTEN there is not
    /// heard (the pooler lends its server connection to others), and named prepared statements
    /// do not survive a transaction. `open` says `pooled: true`.
    #[serde(default)]
    pub pooler: bool,
    /// A `shard-directory relay` publishes the directory's changes through Redis; `open` gives
    /// the client `relay: {url, key}` to follow it instead of a LISTEN of its own.
    #[serde(default)]
    pub relay: bool,
}

/// The driver's `open` options beyond the conninfos.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientOptions {
    /// LISTEN for the directory's notifications (default true); false: told nothing after it
    /// connects but by a refusal, a fill or a refresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<bool>,
    /// How long a write may wait out a freeze, or retry refusals, before it gives up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
}

/// One step. Those with `expect` compare the client's answer: every key `expect` names must be
/// in the answer with that value (objects compared the same way, key by key); others may be.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// SQL on the directory database or a shard's, as its owner.
    Sql {
        on: String,
        run: String,
    },
    /// The mover moves a tenant (copy method), as an operator would.
    Move {
        tenant: String,
        to: String,
    },
    /// A move's steps one at a time, as the mover takes them: `begin_move` in the directory
    /// (`migrating`); `freeze` there and `fence_frozen` on the source (`read_only`); `cutover`:
    /// `complete_move` there and `fence_moved` on the source at its version.
    BeginMove {
        tenant: String,
        to: String,
    },
    Freeze {
        tenant: String,
    },
    Cutover {
        tenant: String,
    },
    /// A shard's minimum accepted version raised to the directory's, as a DBA does after a
    /// failover: every client that has not read that far is refused `stale`.
    RaiseMinAccepted {
        shard: String,
    },
    /// The directory copied while stopped (a cold backup, kept as `name`), and started again;
    /// `restore` puts a copy back in its place: every commit since is lost.
    ColdCopy {
        name: String,
    },
    Restore {
        name: String,
    },
    /// A streaming standby of the directory, named `name` (a server the steps can stop and
    /// start); `failover` to it: the directory crashes, the standby is promoted and put at the
    /// directory's address, as a virtual IP moves. A standby stopped meanwhile has lost what
    /// the directory committed since: its history goes back.
    Standby {
        name: String,
    },
    Failover {
        to: String,
    },
    /// A server stops (fast), or starts again.
    Stop {
        server: String,
    },
    Start {
        server: String,
    },
    /// The client looks a tenant up; with `within_ms`, asked again until the answer matches.
    Lookup {
        tenant: String,
        expect: Value,
        #[serde(default)]
        within_ms: Option<u64>,
    },
    /// The client writes one order of `tenant` in a transaction it routes (stamped, checked,
    /// retried as the contract says). With `as`, in the background: `await` takes its answer.
    Write {
        tenant: String,
        item: String,
        #[serde(default, rename = "as")]
        name: Option<String>,
        #[serde(default)]
        expect: Option<Value>,
    },
    /// The answer of a background step.
    Await {
        name: String,
        expect: Value,
    },
    /// The client reads the tenant's order count in a checked read: `{"reads": ["3"]}`, or two
    /// (source, target) while it is `migrating`.
    Read {
        tenant: String,
        expect: Value,
    },
    /// The client's counters: `{"rejections": {"moved": 1}}`, as changes since `open`.
    Stats {
        expect: Value,
    },
    /// The orders each shard holds of `tenant`, by item count: every acknowledged write once,
    /// on the shard the directory names.
    Rows {
        tenant: String,
        expect: BTreeMap<String, i64>,
    },
}

/// The scenarios in `dir`, by file name.
pub fn load(dir: &Path) -> Result<Vec<Scenario>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut s: Scenario =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            s.name = path
                .file_stem()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok(s)
        })
        .collect()
}

/// The scenarios this crate ships.
pub fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// Whether `answer` holds everything `expect` names (see [`Step`]).
pub fn matches(expect: &Value, answer: &Value) -> bool {
    match (expect, answer) {
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|got| matches(v, got))),
        _ => expect == answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_holds_what_is_expected_and_may_hold_more() {
        let answer = json!({"ok": {"shard": "shard_1", "state": "active", "version": 3}});
        assert!(matches(&json!({"ok": {"shard": "shard_1"}}), &answer));
        assert!(!matches(&json!({"ok": {"shard": "shard_2"}}), &answer));
        assert!(!matches(&json!({"error": {}}), &answer));
        assert!(!matches(
            &json!({"ok": {"reads": ["1"]}}),
            &json!({"ok": {"reads": ["1", "0"]}})
        ));
    }

    #[test]
    fn every_shipped_scenario_reads() {
        let scenarios = load(&shipped()).unwrap();
        assert!(scenarios.len() >= 6, "{}", scenarios.len());
    }
}
