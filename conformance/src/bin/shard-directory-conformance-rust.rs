//! The Rust client's conformance driver: JSON-lines requests on stdin, one answer each on
//! stdout (conformance/README.md), every request in a task of its own so that a write waiting
//! out a freeze does not hold back the steps that end it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use shard_directory_client::{
    Directory, DirectoryConfig, EntityKey, Error, Reads, RelayConfig, RetryPolicy, Router,
    ShardConfig, Statements, Stats,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, RwLock};
use tokio_postgres::types::ToSql;

/// The open client, and its counters when it was opened (`stats` answers the changes since).
struct Open {
    router: Router,
    baseline: Stats,
}

type Client = Arc<RwLock<Option<Open>>>;

#[tokio::main]
async fn main() {
    let (answers, mut out) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(answer) = out.recv().await {
            let mut line = answer.to_string();
            line.push('\n');
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let client: Client = Arc::default();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let request: Value = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                let _ =
                    answers.send(json!({"error": {"kind": "protocol", "message": e.to_string()}}));
                continue;
            }
        };
        let (client, answers) = (client.clone(), answers.clone());
        tasks.push(tokio::spawn(async move {
            let id = request.get("id").cloned().unwrap_or(Value::Null);
            let mut answer = match handle(&client, &request).await {
                Ok(ok) => json!({"ok": ok}),
                Err(error) => json!({"error": error}),
            };
            answer["id"] = id;
            let _ = answers.send(answer);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    drop(answers);
    let _ = writer.await;
}

async fn handle(client: &Client, r: &Value) -> Result<Value, Value> {
    let text = |field: &str| {
        r.get(field)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| protocol(&format!("`{field}` is missing")))
    };
    let op = text("op")?;
    if op == "open" {
        let open = open(r).await.map_err(|e| error(&e))?;
        *client.write().await = Some(open);
        return Ok(json!({}));
    }
    if op == "close" {
        client.write().await.take();
        return Ok(json!({}));
    }
    let guard = client.read().await;
    let open = guard.as_ref().ok_or_else(|| protocol("not open"))?;
    match op.as_str() {
        "lookup" => {
            let entry = open
                .router
                .directory()
                .lookup(&text("entity_type")?, &text("entity_id")?)
                .await
                .map_err(|e| error(&e))?;
            Ok(json!({
                "shard": entry.shard_name.as_str(),
                "target": entry.target_shard.map(|t| t.as_str()),
                "state": entry.state,
                "version": entry.directory_version,
            }))
        }
        "write" | "read" => {
            let key = EntityKey::new(text("entity_type")?, text("entity_id")?);
            let sql = text("sql")?;
            let params: Vec<String> = r
                .get("params")
                .and_then(Value::as_array)
                .map(|p| {
                    p.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            if op == "write" {
                let done: Result<u64, Error> = open
                    .router
                    .run(&key, async move |tx| {
                        Ok(tx.execute(sql.as_str(), &bound(&params)).await?)
                    })
                    .await;
                let rows = done.map_err(|e| error(&e))?;
                Ok(json!({"rows": rows}))
            } else {
                let read: Result<Reads<String>, Error> = open
                    .router
                    .read(&key, async move |tx| {
                        let row = tx.query_one(sql.as_str(), &bound(&params)).await?;
                        Ok(row.get::<_, String>(0))
                    })
                    .await;
                Ok(match read.map_err(|e| error(&e))? {
                    Reads::One(v) => json!({"reads": [v]}),
                    Reads::Both { source, target } => json!({"reads": [source, target]}),
                    Reads::SourceOnly {
                        source,
                        target_unavailable,
                    } => json!({"reads": [source], "target_unavailable": target_unavailable}),
                })
            }
        }
        "stats" => {
            let now = open.router.directory().stats();
            let since: BTreeMap<&str, u64> = now
                .rejections
                .iter()
                .map(|(reason, n)| (reason.as_str(), n - open.baseline.rejections(reason)))
                .collect();
            Ok(json!({"rejections": since}))
        }
        other => Err(protocol(&format!("unknown op `{other}`"))),
    }
}

async fn open(r: &Value) -> Result<Open, Error> {
    let conninfo = |v: Option<&Value>| -> Result<tokio_postgres::Config, Error> {
        v.and_then(Value::as_str)
            .ok_or_else(|| Error::Config("a conninfo is missing".into()))?
            .parse()
            .map_err(|e: tokio_postgres::Error| Error::Config(e.to_string()))
    };
    let mut config = DirectoryConfig::default();
    if r.get("listen").and_then(Value::as_bool) == Some(false) {
        // Told nothing after it connects: no LISTEN, and an hourly poll.
        config = config
            .listen(false)
            .poll_interval(Duration::from_secs(3600));
    }
    // Behind a transaction-mode pooler, statements are not prepared by name (they would not
    // outlive the transaction's server connection).
    let pooled = r.get("pooled").and_then(Value::as_bool) == Some(true);
    if pooled {
        config = config.statements(Statements::Unnamed);
    }
    if let Some(relay) = r.get("relay") {
        let text = |field: &str| relay.get(field).and_then(Value::as_str).unwrap_or_default();
        config = config.relay(RelayConfig::new(
            text("url"),
            text("key").as_bytes().to_vec(),
        ));
    }
    let directory = Directory::connect(conninfo(r.get("directory"))?, config).await?;
    // Open means ready: its watcher (or relay) connected, so that what it caches it keeps
    // (until then every lookup reads the directory).
    let connected = async {
        while !directory.is_connected() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(15), connected)
        .await
        .map_err(|_| Error::Config("the watcher did not connect within 15 s".into()))?;
    let mut shards = Vec::new();
    for (name, c) in r
        .get("shards")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        shards.push(ShardConfig::new(name.clone(), conninfo(Some(c))?));
    }
    let mut router = Router::new(directory.clone(), shards)?;
    if let Some(ms) = r.get("deadline_ms").and_then(Value::as_u64) {
        router = router.with_retry(RetryPolicy::default().deadline(Duration::from_millis(ms)));
    }
    Ok(Open {
        baseline: directory.stats(),
        router,
    })
}

/// Text parameters, bound as text (the statement casts what needs another type).
fn bound(params: &[String]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// An error as the driver protocol names it: its kind, and what the contract says of it.
fn error(e: &Error) -> Value {
    let (kind, extra) = match e {
        Error::Rejected {
            rejection,
            attempts,
            ..
        } => (
            "rejected",
            json!({"reason": rejection.reason(), "attempts": attempts}),
        ),
        Error::ReadOnly(_) => ("read_only", json!({})),
        Error::FailClosed { reason, .. } => ("fail_closed", json!({"reason": reason})),
        Error::UnknownEntity(_) => ("unknown_entity", json!({})),
        Error::DirectoryBehind { .. } => ("directory_behind", json!({})),
        _ if e.is_directory_outage() => ("directory_unavailable", json!({})),
        _ if e.is_shard_unreachable() => ("shard_unavailable", json!({})),
        Error::Db(db) => (
            "db",
            json!({"sqlstate": db.code().map(|c| c.code().to_owned())}),
        ),
        _ => ("other", json!({})),
    };
    let mut error = json!({"kind": kind, "message": e.to_string()});
    if let (Some(o), Value::Object(x)) = (error.as_object_mut(), extra) {
        o.extend(x);
    }
    error
}

fn protocol(message: &str) -> Value {
    json!({"kind": "protocol", "message": message})
}
