//! Issue 8, item 15: a plain `pg_dump | psql` of a directory database and of a shard restores
//! entries (mid-move ones too), version, history, shards and moves, and on a shard
//! `min_accepted` and the fences. The version never goes backwards.

use std::process::Stdio;

use shard_directory_e2e::Cluster;
use tokio_postgres::Client;

/// Every row of `table` as text, in a stable order.
async fn rows(c: &Client, table: &str) -> Vec<String> {
    c.query(
        &format!("SELECT t::text FROM shard_directory.{table} t ORDER BY t::text"),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// `pg_dump source | psql target` (stopping at the first error), as a DBA would.
fn dump_and_restore(cluster: &Cluster, source: &str, target: &str) {
    let mut createdb = cluster.client_command("createdb");
    createdb.arg(target);
    assert!(createdb.status().unwrap().success());
    let dump = cluster
        .client_command("pg_dump")
        .arg(source)
        .output()
        .expect("pg_dump");
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let mut psql = cluster
        .client_command("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", target])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    use std::io::Write;
    psql.stdin.take().unwrap().write_all(&dump.stdout).unwrap();
    let out = psql.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_plain_dump_round_trip_keeps_the_directory_and_the_shard_state() {
    let cluster = Cluster::start("dump", &[]);
    cluster.create_database_with_extension("directory").await;
    let d = cluster.connect("directory").await;
    d.batch_execute(
        "SET search_path = shard_directory;
         INSERT INTO shards (shard_name, region, conninfo) VALUES
             ('shard_1', 'eu', 'host=a dbname=app'), ('shard_2', 'eu', 'host=b dbname=app');
         INSERT INTO shard_directory (entity_type, entity_id, shard_name, region)
             SELECT 'tenant', g::text, 'shard_1', 'eu' FROM generate_series(1, 50) g;
         SELECT begin_move('tenant', '3', 'shard_2');
         SELECT freeze('tenant', '3');
         SELECT begin_move('tenant', '4', 'shard_2');
         SELECT begin_move('tenant', '5', 'shard_2'); SELECT freeze('tenant', '5'); SELECT complete_move('tenant', '5');
         DELETE FROM shard_directory WHERE entity_id = '6';
         INSERT INTO shard_moves (entity_type, entity_id, source_shard, target_shard, method, max_freeze, source_fence, target_fence)
             VALUES ('tenant', '4', 'shard_1', 'shard_2', 'copy', '5 s', '{}', '{}');",
    )
    .await
    .unwrap();
    cluster.create_database_with_extension("shard").await;
    let s = cluster.connect("shard").await;
    s.batch_execute(
        "SELECT shard_directory.raise_min_accepted(7);
         SELECT shard_directory.fence_frozen('tenant', '3');
         SELECT shard_directory.fence_moved('tenant', '5', 'shard_2', 8);
         SELECT shard_directory.fence_owned('tenant', '9', 2);",
    )
    .await
    .unwrap();

    dump_and_restore(&cluster, "directory", "directory_restored");
    dump_and_restore(&cluster, "shard", "shard_restored");

    let r = cluster.connect("directory_restored").await;
    for table in [
        "shards",
        "shard_directory",
        "shard_directory_version",
        "shard_directory_history",
        "shard_moves",
    ] {
        assert_eq!(rows(&r, table).await, rows(&d, table).await, "{table}");
    }
    let rs = cluster.connect("shard_restored").await;
    for table in ["shard_settings", "shard_fences"] {
        assert_eq!(rows(&rs, table).await, rows(&s, table).await, "{table}");
    }

    // The restored directory carries on from where the original stood, never below it.
    let dumped: i64 = d
        .query_one("SELECT shard_directory.current_version()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(dumped >= 7);
    let next: i64 = r
        .query_one("SELECT shard_directory.complete_move('tenant', '3')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(next, dumped + 1);
    let history: i64 = r
        .query_one(
            "SELECT max(history_id) FROM shard_directory.shard_directory_history",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        history,
        rows(&d, "shard_directory_history").await.len() as i64 + 1,
        "history ids continue after the restored ones"
    );
    // A restored shard still refuses what it refused.
    rs.batch_execute("SELECT set_config('app.directory_version', '6', false)")
        .await
        .unwrap();
    let err = rs
        .execute("SELECT shard_directory.assert_directory_version()", &[])
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE)
    );
}
