//! The randomized history (`shard_directory_e2e::history`): a bounded, seeded run here; any
//! number of new seeds, as long as asked, from `scripts/history.sh`. `SD_HISTORY_SEEDS`
//! (comma-separated) and `SD_HISTORY_EVENTS` choose them; each run prints its report.

use shard_directory_e2e::history;

/// The run CI makes: one seed, about two minutes of events, six restores, two moves and a
/// failover among them (with the shared cache's check of reads past the known version taken out,
/// this seed's run fails: 359 writes acknowledged where the surviving directory never named).
const SEED: u64 = 2;
const EVENTS: usize = 40;

fn from_env<T: std::str::FromStr>(name: &str) -> Option<Vec<T>> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .split(',')
            .map(|v| {
                v.trim()
                    .parse()
                    .ok()
                    .unwrap_or_else(|| panic!("{name}: {v:?}"))
            })
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_is_where_the_surviving_directory_named_it() {
    let seeds = from_env("SD_HISTORY_SEEDS").unwrap_or_else(|| vec![SEED]);
    let events = from_env("SD_HISTORY_EVENTS").map_or(EVENTS, |e| e[0]);
    for seed in seeds {
        let report = history::run(seed, events).await;
        println!("{report}");
        assert!(report.holds(), "{report}");
        let acked: usize = report.acked.values().sum();
        assert!(acked > 0, "the routers wrote nothing: {report}");
    }
}
