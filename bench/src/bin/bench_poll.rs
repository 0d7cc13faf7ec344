//! The watcher's read, which every client instance makes on every directory change (so the
//! directory's cost of one change grows with the number of instances): the version row alone
//! (what clients read before 0.2.0) against `changes_since(known)` with one change since,
//! side by side under pgbench, median TPS and the ratio.
//!
//! Run with `bash scripts/bench.sh poll`.

use shard_directory_bench::pgbench;

#[tokio::main]
async fn main() {
    let (seconds, rounds) = pgbench::settings();
    let (cluster, c) = shard_directory_bench::bench_directory("bench-poll", &[]).await;
    // Ten changes: versions 1 to 10, so changes_since(9) reads one.
    for i in 1..=10 {
        c.execute(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
             VALUES ('tenant', $1, 'shard_1')",
            &[&i.to_string()],
        )
        .await
        .unwrap();
    }
    c.batch_execute("VACUUM ANALYZE").await.unwrap();
    let variants: Vec<_> = ["version", "changes"]
        .iter()
        .map(|v| (*v, pgbench::script(&format!("poll_{v}.sql"))))
        .collect();
    println!("the watcher's read, pgbench -M prepared -T {seconds}, {rounds} interleaved rounds, median TPS");
    for clients in ["1", "2"] {
        pgbench::compare(
            &cluster,
            "bench",
            &format!("{clients} clients"),
            &variants,
            clients,
            &seconds,
            rounds,
        );
    }
}
