//! The client's counters reach the recorder the application installs (here metrics-util's
//! debugging recorder; the crate never installs one itself). One test per binary: the recorder is
//! global.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use shard_directory_client::{metrics::names, DirectoryConfig, EntityKey};
use shard_directory_e2e::Topology;

#[tokio::test]
async fn rejections_retries_and_cache_counters_reach_the_applications_recorder() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this test binary");

    let t = Topology::start("metrics").await;
    t.add_tenant("8842", "shard_1").await;
    let config = DirectoryConfig::default()
        .listen(false)
        .poll_interval(Duration::from_secs(3600));
    let d = t.client_directory(config).await;
    let router = t.router(d);
    // Cached before the move, and not told about it: the shard will have to say so.
    router.directory().lookup("tenant", "8842").await.unwrap();
    t.move_tenant("8842", "shard_2").await;
    router
        .run(&EntityKey::new("tenant", "8842"), async |tx| {
            tx.execute("INSERT INTO orders VALUES ('8842', 'x')", &[])
                .await?;
            Ok::<_, shard_directory_client::Error>(())
        })
        .await
        .unwrap();

    // One snapshot: taking one drains the debugging recorder's counters.
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str, label: Option<(&str, &str)>| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .filter(|(key, ..)| {
                label
                    .is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    };
    assert_eq!(counter(names::REJECTIONS, Some(("reason", "moved"))), 1);
    assert_eq!(counter(names::RETRIES, None), 1);
    assert_eq!(
        counter(names::CACHE_MISSES, None),
        1,
        "the lookup before the move"
    );
    assert_eq!(
        counter(names::CACHE_HITS, None),
        2,
        "the stale route, then the one moved_to taught"
    );
    assert!(
        counter(names::STORE_QUERIES, None) >= 2,
        "the version read at connect and the miss"
    );
}
