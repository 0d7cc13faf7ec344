//! SQLsmith against the shard's check (`shard_directory_e2e::fuzz`): a bounded run with fixed
//! seeds here (`SD_FUZZ_SEEDS`, `SD_FUZZ_QUERIES`), as long a run as asked with new seeds from
//! `scripts/fuzz.sh`. It prints what it ran and found; any crash or fenced row fails it, with the
//! statement that did it (then a regression test of its own: `shard_sql.rs`).

use std::time::Instant;

use shard_directory_e2e::fuzz::{Counts, FuzzShard, Plan};

#[tokio::test]
async fn sqlsmith_neither_crashes_a_shard_nor_writes_a_fenced_row() {
    let plan = Plan::from_env();
    let shard = FuzzShard::start("fuzz").await;
    // The oracle sees a write that passes a fence on purpose.
    shard.bypass().await;
    let seen = shard.fenced_rows();
    assert_eq!(seen.len(), 1, "the oracle must see the deliberate bypass");

    let start = Instant::now();
    let mut counts = Counts::default();
    let mut seeds = Vec::new();
    while let Some(seed) = plan.next_seed(seeds.len(), start) {
        counts += shard.sqlsmith(seed, plan.queries);
        seeds.push(seed);
    }
    let (crashes, restarted) = shard.crashes().await;
    let fenced: Vec<String> = shard.fenced_rows().split_off(seen.len());
    println!(
        "fuzz: {} statements ({} failed) from seeds {:?} in {:.0?}; crashes: {}{}; fenced rows \
         written: {}; refused by the check: {:?}",
        counts.statements,
        counts.failed,
        seeds,
        start.elapsed(),
        crashes.len(),
        if restarted {
            " (the postmaster restarted)"
        } else {
            ""
        },
        fenced.len(),
        shard.refusals().await,
    );
    assert!(
        crashes.is_empty() && !restarted,
        "the server crashed:\n{}",
        crashes.join("\n")
    );
    assert!(
        fenced.is_empty(),
        "fenced rows written:\n{}",
        fenced.join("\n")
    );
}
