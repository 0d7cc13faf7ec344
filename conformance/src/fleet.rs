//! A fleet lent to a client's own tests (`shard-directory-conformance --fleet N`): the
//! scenarios' clusters, their addresses printed as one JSON line, kept until stdin ends, so that
//! a test suite in another language (the Python package's pytest) has no harness of its own.

use serde_json::{json, Value};
use shard_directory_e2e::topology::{DIRECTORY_DB, SHARD_DB};
use shard_directory_e2e::Topology;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Starts a directory and `shards` shards, prints where they are, and stops them once stdin
/// ends (the test suite exited, or closed the pipe).
pub async fn lend(shards: usize) {
    let t = Topology::with_shards("lent", shards).await;
    let addresses: serde_json::Map<String, Value> = t
        .shards
        .iter()
        .map(|(name, c)| (name.clone(), Value::from(c.conn_str(SHARD_DB))))
        .collect();
    let line = json!({
        "directory": t.directory.conn_str(DIRECTORY_DB),
        "shards": addresses,
    });
    let mut stdout = tokio::io::stdout();
    let printed = async {
        stdout.write_all(format!("{line}\n").as_bytes()).await?;
        stdout.flush().await
    };
    if printed.await.is_ok() {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    }
    drop(t);
}
