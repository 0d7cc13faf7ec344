//! The directory's write path: one entry's region changed per transaction, under pgbench, on a
//! plain table (no trigger), the guide's PL/pgSQL statement trigger (bump and notify), the guide's
//! trigger plus the extension's rules written in PL/pgSQL (`rules`: shard and region check,
//! stamp, history row) and the extension (the same, native), side by side in one database, at 1
//! and 2 clients, in interleaved rounds, median TPS of each and its ratio to the plain table.
//! The library is preloaded, as docs/shard.md recommends: a statement then expects its version from
//! shared memory instead of reading the version row.
//!
//! Then two entries changed per transaction, one statement each, among 50 hot entries, at 2 and
//! 12 clients: the plain table, the guide's trigger and the extension, with the transactions
//! each lost to a deadlock (the guide's trigger, and the extension before it took its versions
//! at commit, locked the version row at the first statement's end and held it while the second
//! waited for rows).
//!
//! Run with `bash scripts/bench.sh directory` (installs a release build first).

use shard_directory_bench::pgbench;
use shard_directory_e2e::Cluster;

#[tokio::main]
async fn main() {
    let (seconds, rounds) = pgbench::settings();
    let cluster = Cluster::start(
        "bench-directory",
        &[("shared_preload_libraries", "shard_directory")],
    );
    cluster.create_database_with_extension("bench").await;
    let setup = std::fs::read_to_string(pgbench::script("directory_setup.sql")).unwrap();
    let c = cluster.connect("bench").await;
    c.batch_execute(&setup).await.unwrap();
    c.batch_execute("VACUUM ANALYZE").await.unwrap();
    let variants: Vec<_> = ["plain", "guide", "rules", "extension"]
        .iter()
        .map(|v| (*v, pgbench::script(&format!("directory_update_{v}.sql"))))
        .collect();
    println!("directory UPDATE of one entry, pgbench -M prepared -T {seconds}, {rounds} interleaved rounds, median TPS");
    for clients in ["1", "2"] {
        let title = format!("{clients} client{}", if clients == "1" { "" } else { "s" });
        let tps = pgbench::compare(
            &cluster, "bench", &title, &variants, clients, &seconds, rounds,
        );
        let (guide, rules, extension) = (&tps[1], &tps[2], &tps[3]);
        println!(
            "{title:>10} extension / guide, paired round by round: {:.2}x; extension / rules: {:.2}x",
            pgbench::paired(extension, guide),
            pgbench::paired(extension, rules),
        );
    }
    let two: Vec<_> = ["plain", "guide", "extension"]
        .iter()
        .map(|v| (*v, pgbench::script(&format!("directory_update2_{v}.sql"))))
        .collect();
    println!("two entries' UPDATEs per transaction (50 hot entries), median TPS");
    for clients in ["2", "12"] {
        let title = format!("{clients} clients");
        let tps = pgbench::compare(&cluster, "bench", &title, &two, clients, &seconds, rounds);
        println!(
            "{title:>10} extension / guide, paired round by round: {:.2}x; extension / plain: {:.2}x",
            pgbench::paired(&tps[2], &tps[1]),
            pgbench::paired(&tps[2], &tps[0]),
        );
    }
}
