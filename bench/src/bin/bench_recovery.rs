//! Stale-client recovery: a routed write whose cached route is out of date, from the shard's
//! refusal to the committed retry on the right shard, side by side with the same write on a
//! current route. Two kinds of staleness: a tenant moved by the mover (the old shard's refusal
//! names the new shard and its version: the retry goes straight there) and a tenant re-pointed
//! in an emergency with a shard-wide `raise_min_accepted` on the old shard (the refusal says only
//! "stale": the client reads what changed from the directory, then the entry). The client does
//! not LISTEN and polls hourly, so it learns of each change from the shard's refusal alone.
//! `BENCH_TRIALS` (30) of each; p50 and p99 in ms and their ratio to the current route's.
//!
//! Run with `bash scripts/bench.sh recovery`.

use std::time::{Duration, Instant};

use shard_directory_client::{DirectoryConfig, EntityKey, Error, Router};
use shard_directory_e2e::Topology;

/// One routed INSERT for `tenant`; its latency in ms.
async fn write(router: &Router, tenant: &str) -> f64 {
    let started = Instant::now();
    router
        .run(&EntityKey::new("tenant", tenant), async |tx| {
            tx.execute("INSERT INTO orders VALUES ($1, 'x')", &[&tenant])
                .await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    started.elapsed().as_secs_f64() * 1e3
}

fn summary(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

#[tokio::main]
async fn main() {
    let trials: usize = shard_directory_bench::setting("BENCH_TRIALS", 30);
    let t = Topology::start("bench-recovery").await;
    t.add_tenant("current", "shard_1").await;
    t.add_tenant("bystander", "shard_2").await;
    for k in 0..trials {
        t.add_tenant(&format!("moved-{k}"), "shard_1").await;
        t.add_tenant(&format!("repointed-{k}"), "shard_1").await;
    }
    let deaf = DirectoryConfig::default()
        .listen(false)
        .poll_interval(Duration::from_secs(3600));
    let router = t.router(t.client_directory(deaf).await);
    let (mut current, mut moved, mut repointed) = (Vec::new(), Vec::new(), Vec::new());
    // Cached before the trials: a miss would read the directory and teach the client the move.
    write(&router, "bystander").await;
    let mut dba = t.dba().await;
    let source = t.shard("shard_1").await;
    for k in 0..trials {
        let (m, r) = (format!("moved-{k}"), format!("repointed-{k}"));
        // Each route cached, then changed behind the client's back, one at a time (a
        // shard-wide minimum would refuse the moved tenant's write as stale first).
        for tenant in [m.as_str(), r.as_str(), "current"] {
            write(&router, tenant).await;
        }
        let cutover = t.move_tenant(&m, "shard_2").await;
        // The mover's work invalidated the target's cached plans: another tenant's write there
        // takes the replanning, which is the move's cost, not the recovery's.
        write(&router, "bystander").await;
        moved.push(write(&router, &m).await);
        // The refusal sent the watcher to read what changed: let it finish before the re-point.
        router.directory().wait_for_version(cutover).await;
        current.push(write(&router, "current").await);
        let tx = dba.transaction().await.unwrap();
        tx.batch_execute("SET LOCAL shard_directory.allow_repoint = on")
            .await
            .unwrap();
        tx.execute(
            "UPDATE shard_directory.shard_directory SET shard_name = 'shard_2' \
             WHERE entity_type = 'tenant' AND entity_id = $1",
            &[&r],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let version = t.step("SELECT shard_directory.current_version()").await;
        source
            .execute("SELECT shard_directory.raise_min_accepted($1)", &[&version])
            .await
            .unwrap();
        repointed.push(write(&router, &r).await);
    }
    let stats = router.directory().stats();
    assert!(stats.rejections("moved") >= trials as u64);
    assert!(stats.rejections("stale") >= trials as u64);
    // The retries landed on the new shard (a re-point, unlike a move, leaves earlier rows behind).
    for (tenant, rows) in [("moved-0", 2), ("repointed-0", 1)] {
        assert_eq!(t.orders("shard_2", tenant).await.len(), rows, "{tenant}");
    }
    let base = summary(current);
    println!(
        "a routed INSERT, ms from the call to the commit ({trials} trials each; a client that learns \
         of changes only from shards' refusals)"
    );
    println!("| route | p50 | p99 | p50 / current route |");
    println!("|---|---|---|---|");
    println!("| current | {:.2} | {:.2} | 1.00x |", base.0, base.1);
    for (name, v) in [
        ("moved: refused with moved-to, retried there", moved),
        (
            "re-pointed: refused as stale, directory read, retried",
            repointed,
        ),
    ] {
        let (p50, p99) = summary(v);
        println!("| {name} | {p50:.2} | {p99:.2} | {:.2}x |", p50 / base.0);
    }
}
