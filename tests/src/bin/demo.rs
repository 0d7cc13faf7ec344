//! The demo scenario: a throwaway directory cluster; a tenant moves between shards while a
//! listener hears each new version; a refused step; the history that answers "where was it?".

use std::time::Duration;

use shard_directory_e2e::{Cluster, Listener};
use tokio_postgres::Client;

async fn show(c: &Client, title: &str, sql: &str) {
    println!("\n-- {title}");
    let rows = c.simple_query(sql).await.expect("demo query");
    for msg in rows {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = msg {
            let cols: Vec<String> = (0..row.len())
                .map(|i| {
                    format!(
                        "{}={}",
                        row.columns()[i].name(),
                        row.get(i).unwrap_or("NULL")
                    )
                })
                .collect();
            println!("   {}", cols.join("  "));
        }
    }
}

async fn heard(app: &mut Listener) -> tokio_postgres::Notification {
    tokio::time::timeout(Duration::from_secs(5), app.notifications.recv())
        .await
        .expect("notification within 5 s")
        .expect("listener open")
}

#[tokio::main]
async fn main() {
    println!("starting a throwaway directory cluster ...");
    let cluster = Cluster::start("demo-directory", &[]);
    cluster.create_database_with_extension("directory").await;
    println!(
        "directory database on 127.0.0.1:{} (extension shard_directory installed)",
        cluster.port()
    );
    let dba = cluster.connect("directory").await;
    let mut app = cluster.connect_listening("directory").await;
    app.client
        .batch_execute("LISTEN shard_directory")
        .await
        .unwrap();

    dba.batch_execute(
        "INSERT INTO shard_directory.shards (shard_name, region) VALUES ('shard_1', 'eu'), ('shard_2', 'eu'), ('shard_3', 'us');
         INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name, region)
         VALUES ('tenant', '8842', 'shard_1', 'eu'), ('tenant', '17', 'shard_2', 'eu')",
    )
    .await
    .unwrap();
    let n = heard(&mut app).await;
    println!(
        "\nseeded two tenants in one INSERT; listener heard version '{}'",
        n.payload()
    );
    show(&dba, "two tenants, one statement, one version", "SELECT entity_id, shard_name, state, version FROM shard_directory.shard_directory ORDER BY 1").await;

    for step in [
        "begin_move('tenant', '8842', 'shard_2')",
        "freeze('tenant', '8842')",
        "complete_move('tenant', '8842')",
    ] {
        let v: i64 = dba
            .query_one(&format!("SELECT shard_directory.{step}"), &[])
            .await
            .unwrap()
            .get(0);
        let n = heard(&mut app).await;
        println!(
            "\n{step:<42} -> version {v}; listener heard '{}' on channel '{}'",
            n.payload(),
            n.channel()
        );
    }

    println!("\n-- the guide's bare re-point of an active tenant:");
    let err = dba
        .batch_execute("UPDATE shard_directory.shard_directory SET shard_name = 'shard_1' WHERE entity_id = '8842'")
        .await
        .unwrap_err();
    let db = err.as_db_error().unwrap();
    println!(
        "   ERROR {}: {}\n   HINT: {}",
        db.code().code(),
        db.message(),
        db.hint().unwrap_or("")
    );

    show(
        &dba,
        "history of tenant 8842",
        "SELECT op, transition, old_shard, new_shard, new_state, version, changed_by \
         FROM shard_directory.shard_directory_history WHERE entity_id = '8842' ORDER BY history_id",
    )
    .await;
    show(
        &dba,
        "placement_at: where was tenant 8842 before the move, and now?",
        "SELECT shard_directory.placement_at('tenant', '8842', \
           (SELECT changed_at FROM shard_directory.shard_directory_history WHERE entity_id = '8842' ORDER BY history_id LIMIT 1)) AS at_insert, \
           shard_directory.placement_at('tenant', '8842', now()) AS now",
    )
    .await;
    println!("\ndone; the cluster is removed.");
}
