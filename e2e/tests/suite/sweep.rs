//! The failpoint sweep (`e2e/src/sweep.rs`): every step of every kind of move, faulted every way
//! under a writer, keeps a move's three invariants. CI runs a share of the cases that rotates
//! daily; `bash scripts/sweep.sh` runs them all.

use std::collections::BTreeMap;
use std::time::Instant;

use shard_directory_e2e::sweep::{cases, select, Sweep, SCENARIOS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_of_every_move_faulted_every_way_keeps_the_invariants() {
    let started = Instant::now();
    let mut sweep = Sweep::start("sweep").await;
    let (mut census, mut failures) = (BTreeMap::new(), Vec::new());
    for scenario in SCENARIOS {
        match sweep.census(scenario).await {
            Ok(points) => {
                println!("sweep: census of {}: {points:?}", scenario.name());
                census.insert(scenario, points);
            }
            Err(e) => failures.push(format!("the census of {}: {e}", scenario.name())),
        }
    }
    let all = cases(&census);
    let total = all.len();
    let (chosen, selection) = select(all);
    for case in &chosen {
        let at = Instant::now();
        let result = sweep.case(case).await;
        println!(
            "sweep: {case}: {} in {:.1?}",
            if result.is_ok() { "ok" } else { "BROKEN" },
            at.elapsed()
        );
        if let Err(e) = result {
            println!("  {e}");
            failures.push(format!("{case}: {e}"));
        }
    }
    println!(
        "sweep: {} of {total} cases ({selection}) and {} censuses in {:.0?}",
        chosen.len(),
        SCENARIOS.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} case(s) broke an invariant (one re-runs with SD_SWEEP_CASE=<scenario/point/fault>):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
