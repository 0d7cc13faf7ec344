//! Runs a scenario against a driver: the fleet from the end-to-end suite's harness (throwaway
//! clusters), the client behind the driver, each step in turn.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shard_directory_e2e::pgbouncer::PgBouncer;
use shard_directory_e2e::redis::RedisServer;
use shard_directory_e2e::topology::{DIRECTORY_DB, SHARD_DB};
use shard_directory_e2e::{mover_cli, Cluster, ColdCopy, Topology};
use tokio::sync::oneshot;

use crate::driver::{Broken, Driver};
use crate::scenario::{matches, Scenario, Step};

/// What a `write` step runs: one order of the tenant.
pub const WRITE: &str = "INSERT INTO orders (tenant_id, item) VALUES ($1, $2)";
/// What a `read` step runs: the tenant's order count, as text.
pub const READ: &str = "SELECT count(*)::text FROM orders WHERE tenant_id = $1";

/// The key the relay seals its messages with, given to the client as text.
const RELAY_KEY: &str = "the conformance relay's key";

/// How a scenario failed: the step (counted from 1, 0 for the set-up) and why.
#[derive(Debug, thiserror::Error)]
#[error("{scenario}, step {step}: {why}")]
pub struct Failure {
    pub scenario: String,
    pub step: usize,
    pub why: String,
}

/// Runs `s` against the driver `command` (`sh -c`), on a fleet of its own.
pub async fn run(s: &Scenario, command: &str) -> Result<(), Failure> {
    let fail = |step: usize, why: String| Failure {
        scenario: s.name.clone(),
        step,
        why,
    };
    let t = Topology::with_shards(&format!("conf-{}", short(&s.name)), s.shards).await;
    for (tenant, shard) in &s.tenants {
        t.add_tenant(tenant, shard).await;
    }
    let driver = Driver::start(command).map_err(|e| fail(0, e.to_string()))?;
    let shards: serde_json::Map<String, Value> = t
        .shards
        .iter()
        .map(|(name, c)| (name.clone(), Value::from(c.conn_str(SHARD_DB))))
        .collect();
    let mut open = json!({
        "directory": t.directory.conn_str(DIRECTORY_DB),
        "shards": shards,
    });
    // Kept until the scenario ends (each is stopped on drop).
    let pooler = match s.fleet.pooler {
        true => Some(PgBouncer::start(&t.directory, 2).await),
        false => None,
    };
    if let Some(pooler) = &pooler {
        open["directory"] = pooler.conn_str(DIRECTORY_DB).into();
        open["pooled"] = true.into();
    }
    let relay = match s.fleet.relay {
        true => {
            let redis = RedisServer::start().await;
            let relay = mover_cli::relay(&t, &redis.url(), RELAY_KEY.as_bytes(), "postgres");
            open["relay"] = json!({"url": redis.url(), "key": RELAY_KEY});
            Some((redis, relay))
        }
        false => None,
    };
    if let (Some(o), Value::Object(options)) = (open.as_object_mut(), json!(s.client)) {
        o.extend(options);
    }
    let opened = driver
        .ask("open", open)
        .await
        .map_err(|e| fail(0, e.to_string()))?;
    if opened.get("ok").is_none() {
        return Err(fail(0, format!("open: {opened}")));
    }
    let mut kept = Kept::default();
    for (i, step) in s.steps.iter().enumerate() {
        let at = i + 1;
        step_on(&t, &driver, step, &mut kept)
            .await
            .map_err(|why| fail(at, format!("{step:?}: {why}")))?;
    }
    if let Some(name) = kept.background.keys().next() {
        return Err(fail(s.steps.len(), format!("`{name}` was never awaited")));
    }
    let closed = driver
        .close()
        .await
        .map_err(|e| fail(s.steps.len(), e.to_string()));
    drop((relay, pooler));
    closed
}

/// What steps leave for later ones: background answers, cold copies, standbys.
#[derive(Default)]
struct Kept {
    background: HashMap<String, oneshot::Receiver<Value>>,
    copies: HashMap<String, ColdCopy>,
    standbys: HashMap<String, Cluster>,
}

async fn step_on(
    t: &Topology,
    driver: &Driver,
    step: &Step,
    kept: &mut Kept,
) -> Result<(), String> {
    let background = &mut kept.background;
    let broken = |e: Broken| e.to_string();
    match step {
        Step::Sql { on, run } => {
            let client = if on == "directory" {
                t.dba().await
            } else {
                t.shard(on).await
            };
            client
                .batch_execute(run)
                .await
                .map_err(|e| format!("{on}: {}", db(&e)))?;
        }
        Step::Move { tenant, to } => {
            t.move_tenant(tenant, to).await;
        }
        Step::BeginMove { tenant, to } => {
            t.dba()
                .await
                .execute(
                    "SELECT shard_directory.begin_move('tenant', $1, $2)",
                    &[tenant, to],
                )
                .await
                .map_err(|e| db(&e))?;
        }
        Step::Freeze { tenant } => {
            t.dba()
                .await
                .execute("SELECT shard_directory.freeze('tenant', $1)", &[tenant])
                .await
                .map_err(|e| db(&e))?;
            let (source, _) = t.entry("tenant", tenant).await;
            t.shard(&source)
                .await
                .execute(
                    "SELECT shard_directory.fence_frozen('tenant', $1)",
                    &[tenant],
                )
                .await
                .map_err(|e| db(&e))?;
        }
        Step::Cutover { tenant } => {
            let dba = t.dba().await;
            let moving = dba
                .query_one(
                    "SELECT shard_name, target_shard FROM shard_directory.shard_directory \
                     WHERE entity_type = 'tenant' AND entity_id = $1",
                    &[tenant],
                )
                .await
                .map_err(|e| db(&e))?;
            let (source, target): (String, Option<String>) = (moving.get(0), moving.get(1));
            let target = target.ok_or_else(|| format!("{tenant} is not moving"))?;
            let version: i64 = dba
                .query_one(
                    "SELECT shard_directory.complete_move('tenant', $1)",
                    &[tenant],
                )
                .await
                .map_err(|e| db(&e))?
                .get(0);
            t.shard(&source)
                .await
                .execute(
                    "SELECT shard_directory.fence_moved('tenant', $1, $2, $3)",
                    &[tenant, &target, &version],
                )
                .await
                .map_err(|e| db(&e))?;
        }
        Step::RaiseMinAccepted { shard } => {
            let version = t.step("SELECT shard_directory.current_version()").await;
            t.shard(shard)
                .await
                .execute("SELECT shard_directory.raise_min_accepted($1)", &[&version])
                .await
                .map_err(|e| db(&e))?;
        }
        Step::ColdCopy { name } => {
            kept.copies.insert(name.clone(), t.directory.cold_copy());
        }
        Step::Restore { name } => {
            let copy = kept
                .copies
                .get(name)
                .ok_or_else(|| format!("no cold copy `{name}`"))?;
            t.directory.restore_cold_copy(copy);
        }
        Step::Standby { name } => {
            let standby = t
                .streaming_standby(&format!("{}-{name}", t.directory.name()))
                .await;
            kept.standbys.insert(name.clone(), standby);
        }
        Step::Failover { to } => {
            let standby = kept
                .standbys
                .get(to)
                .ok_or_else(|| format!("no standby `{to}`"))?;
            t.directory.crash();
            if !standby.is_running() {
                standby.restart();
            }
            standby.promote();
            t.directory.take_over(standby);
        }
        Step::Stop { server } => cluster(t, &kept.standbys, server)?.stop(),
        Step::Start { server } => cluster(t, &kept.standbys, server)?.restart(),
        Step::Lookup {
            tenant,
            expect,
            within_ms,
        } => {
            let until = Instant::now() + Duration::from_millis(within_ms.unwrap_or(0));
            loop {
                let answer = driver
                    .ask(
                        "lookup",
                        json!({"entity_type": "tenant", "entity_id": tenant}),
                    )
                    .await
                    .map_err(broken)?;
                if matches(expect, &answer) {
                    break;
                }
                if Instant::now() >= until {
                    return Err(format!("answered {answer}, expected {expect}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Step::Write {
            tenant,
            item,
            name,
            expect,
        } => {
            let rx = driver
                .send(
                    "write",
                    json!({"entity_type": "tenant", "entity_id": tenant,
                           "sql": WRITE, "params": [tenant, item]}),
                )
                .await
                .map_err(broken)?;
            match name {
                Some(name) => {
                    background.insert(name.clone(), rx);
                }
                None => {
                    let answer = driver.answer("write", rx).await.map_err(broken)?;
                    let expect = expect.clone().unwrap_or_else(|| json!({"ok": {}}));
                    expected(&expect, &answer)?;
                }
            }
        }
        Step::Await { name, expect } => {
            let rx = background
                .remove(name)
                .ok_or_else(|| format!("no background step `{name}`"))?;
            expected(expect, &driver.answer(name, rx).await.map_err(broken)?)?;
        }
        Step::Read { tenant, expect } => {
            let answer = driver
                .ask(
                    "read",
                    json!({"entity_type": "tenant", "entity_id": tenant,
                           "sql": READ, "params": [tenant]}),
                )
                .await
                .map_err(broken)?;
            expected(expect, &answer)?;
        }
        Step::Stats { expect } => {
            expected(
                expect,
                &driver.ask("stats", json!({})).await.map_err(broken)?,
            )?;
        }
        Step::Rows { tenant, expect } => {
            for (shard, want) in expect {
                let (orders, _) = t.rows(shard, tenant).await;
                if orders != *want {
                    return Err(format!(
                        "{shard} holds {orders} orders of {tenant}, not {want}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A database error with what the server said: its SQLSTATE and message.
fn db(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} {}", d.code().code(), d.message()),
        None => e.to_string(),
    }
}

fn expected(expect: &Value, answer: &Value) -> Result<(), String> {
    if matches(expect, answer) {
        Ok(())
    } else {
        Err(format!("answered {answer}, expected {expect}"))
    }
}

/// The server `server` names: the directory, a shard, or a standby a step made.
fn cluster<'t>(
    t: &'t Topology,
    standbys: &'t HashMap<String, Cluster>,
    server: &str,
) -> Result<&'t Cluster, String> {
    if server == "directory" {
        return Ok(&t.directory);
    }
    t.shards
        .iter()
        .find(|(name, _)| name == server)
        .map(|(_, c)| c)
        .or_else(|| standbys.get(server))
        .ok_or_else(|| format!("no server {server}"))
}

/// A scenario's name cut for its clusters' names.
fn short(name: &str) -> String {
    name.chars().take(16).collect()
}
