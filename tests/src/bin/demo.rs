//! The demo scenario, against throwaway clusters: a directory database and two shards.
//! Tenants are routed by the client; one moves while a listener hears each new version; a client
//! that missed the move is refused by the old shard and lands its write on the new one; a bare
//! re-point is refused; history answers "where was it?".

use std::time::Duration;

use shard_directory_client::{DirectoryConfig, EntityKey, Router};
use shard_directory_e2e::{Listener, Topology};
use tokio_postgres::Client;

async fn show(c: &Client, title: &str, sql: &str) {
    println!("\n-- {title}");
    for msg in c.simple_query(sql).await.expect("demo query") {
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

async fn heard(app: &mut Listener) -> String {
    let n = tokio::time::timeout(Duration::from_secs(5), app.notifications.recv())
        .await
        .expect("notification within 5 s")
        .expect("listener open");
    n.payload().to_owned()
}

async fn write(router: &Router, tenant: &str, item: &str) {
    let (t, i) = (tenant.to_owned(), item.to_owned());
    router
        .run(&EntityKey::new("tenant", tenant), async |tx| {
            tx.execute("INSERT INTO orders VALUES ($1, $2)", &[&t, &i])
                .await?;
            Ok::<_, shard_directory_client::Error>(())
        })
        .await
        .expect("routed write");
}

#[tokio::main]
async fn main() {
    println!("starting throwaway clusters: a directory and two shards ...");
    let t = Topology::start("demo").await;
    println!(
        "directory on 127.0.0.1:{}, shard_1 on :{}, shard_2 on :{} (orders protected on both)",
        t.directory.port(),
        t.shard_cluster("shard_1").port(),
        t.shard_cluster("shard_2").port()
    );
    let dba = t.dba().await;
    let mut listener = t.directory.connect_listening("directory").await;
    listener
        .client
        .batch_execute("LISTEN shard_directory")
        .await
        .unwrap();

    dba.batch_execute(
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
         VALUES ('tenant', '8842', 'shard_1'), ('tenant', '17', 'shard_1')",
    )
    .await
    .unwrap();
    println!(
        "\ntwo tenants added in one INSERT; the listener heard version {}",
        heard(&mut listener).await
    );

    let app = t.router(t.client_directory(DirectoryConfig::default()).await);
    let (debug_addr, _debug) = shard_directory_client::debug_http::serve(
        app.directory().clone(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    // A second instance that will not hear about the move (no LISTEN, hourly poll).
    let deaf_config = DirectoryConfig::default()
        .listen(false)
        .poll_interval(Duration::from_secs(3600));
    let deaf = t.router(t.client_directory(deaf_config).await);
    write(&app, "8842", "first order").await;
    write(&deaf, "8842", "second order").await;
    println!(
        "two orders for tenant 8842 routed to shard_1 at version {}",
        app.directory().version()
    );

    println!("\nmoving tenant 8842 to shard_2 with the mover (its rows, then the fences):");
    let moved_at = t.move_tenant("8842", "shard_2").await;
    for _ in 0..3 {
        println!("   listener heard version {}", heard(&mut listener).await);
    }
    println!(
        "   cutover at version {moved_at}; debug endpoint http://{debug_addr}/debug/directory"
    );

    let (before, stale_version) = (deaf.directory().stats(), deaf.directory().version());
    write(&deaf, "8842", "third order").await;
    let after = deaf.directory().stats();
    println!(
        "\nthe instance that missed the move wrote at version {}: shard_1 refused it (moved), it retried on \
         shard_2 with {} directory queries; rejections(moved) = {}",
        stale_version,
        after.store_queries - before.store_queries,
        after.rejections("moved"),
    );
    println!(
        "   orders of tenant 8842: shard_1 {:?}, shard_2 {:?}",
        t.orders("shard_1", "8842").await,
        t.orders("shard_2", "8842").await
    );

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
        "placement_at: where was tenant 8842 when it was added, and now?",
        "SELECT shard_directory.placement_at('tenant', '8842', \
           (SELECT changed_at FROM shard_directory.shard_directory_history WHERE entity_id = '8842' ORDER BY history_id LIMIT 1)) AS at_insert, \
           shard_directory.placement_at('tenant', '8842', now()) AS now",
    )
    .await;
    show(
        &t.shard("shard_1").await,
        "shard_1 stats()",
        "SELECT reason, count FROM shard_directory.stats() WHERE count > 0",
    )
    .await;
    println!("\ndone; the clusters are removed.");
}
