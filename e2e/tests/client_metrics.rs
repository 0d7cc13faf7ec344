//! The client's metrics reach the recorder the application installs, here
//! `metrics-exporter-prometheus` as a service would install it (the crate never installs one),
//! under the names of `metrics::names` (Prometheus writes `directory.serving_stale` as
//! `directory_serving_stale`), with the same counts as `Directory::stats()`; every path by which
//! a newer version reaches the cache counts as an invalidation (a shard's `moved` refusal and a
//! fill that read a newer version send the watcher to read what changed), and a gap history no
//! longer covers counts as a full flush. One test per binary: the recorder is global.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use shard_directory_client::{metrics::names, DirectoryConfig, EntityKey, Error, Stats};
use shard_directory_e2e::prometheus::sample;
use shard_directory_e2e::{eventually, reaches, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

/// One count of `Directory::stats()`.
type Count = fn(&Stats) -> u64;

#[tokio::test]
async fn every_count_and_every_invalidation_path_reaches_the_applications_prometheus_exporter() {
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder in this test binary");
    let t = Topology::start("metrics").await;
    t.add_tenant("8842", "shard_1").await;
    let hour = Duration::from_secs(3600);
    let listening = t
        .client_directory(DirectoryConfig::default().poll_interval(hour))
        .await;
    // A change a notification brings is not late: the lag is recorded for polls and reconnects
    // only (none has brought news yet: no series at all).
    let lag_count = || {
        let series = format!("{}_count", names::INVALIDATION_LAG);
        let text = prometheus.render();
        text.contains(&series).then(|| sample(&text, &series))
    };
    let before = lag_count();
    let heard = listening.stats().invalidations;
    let v = t.add_tenant("heard", "shard_1").await;
    reaches(&listening, v).await;
    eventually("the notification's invalidation", DEADLINE, || async {
        (listening.stats().invalidations > heard).then_some(())
    })
    .await;
    assert_eq!(lag_count(), before, "a notification is not lag");
    // Told nothing: no LISTEN, no poll.
    let deaf = t
        .client_directory(DirectoryConfig::default().listen(false).poll_interval(hour))
        .await;
    let polling = t
        .client_directory(
            DirectoryConfig::default()
                .listen(false)
                .poll_interval(Duration::from_millis(100)),
        )
        .await;

    // A shard's `moved` refusal: the route cached before the move is refused, and moved_to
    // brings the cutover's version.
    let router = t.router(deaf.clone());
    deaf.lookup("tenant", "8842").await.unwrap();
    let cutover = t.move_tenant("8842", "shard_2").await;
    router
        .run(&EntityKey::new("tenant", "8842"), async |tx| {
            tx.execute("INSERT INTO orders VALUES ('8842', 'x')", &[])
                .await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    reaches(&deaf, cutover).await;
    assert_eq!(deaf.stats().invalidations, 1, "the moved refusal");
    // refresh(), across a change whose history was purged: the client cannot tell what changed.
    t.add_tenant("2a", "shard_1").await;
    t.purge_history().await;
    let v = t.add_tenant("2", "shard_1").await;
    assert_eq!(deaf.refresh().await.unwrap(), v);
    assert_eq!(deaf.stats().invalidations, 2, "refresh()");
    assert_eq!(
        deaf.stats().full_flushes,
        1,
        "refresh() across the purged gap"
    );
    // A fill that read a newer version than the client knew.
    let last = t.add_tenant("3", "shard_1").await;
    deaf.lookup("tenant", "3").await.unwrap();
    reaches(&deaf, last).await;
    assert_eq!(deaf.stats().invalidations, 3, "a fill that read newer");
    // The watcher: a notification, a poll.
    reaches(&listening, last).await;
    reaches(&polling, last).await;
    assert!(listening.stats().invalidations >= 1);
    assert!(polling.stats().invalidations >= 1);

    // The directory goes away: once the watchers know, a cached entry is served stale.
    t.directory.stop();
    for d in [&deaf, &listening, &polling] {
        eventually("the watcher to notice", DEADLINE, || async {
            (!d.is_connected()).then_some(())
        })
        .await;
    }
    let served = deaf.lookup("tenant", "3").await.unwrap();
    assert_eq!(served.shard_name, "shard_1");

    let total = |f: Count| -> f64 {
        [&deaf, &listening, &polling]
            .iter()
            .map(|d| f(&d.stats()))
            .sum::<u64>() as f64
    };
    let text = prometheus.render();
    let counters: [(&str, Count); 8] = [
        (names::INVALIDATIONS, |s| s.invalidations),
        (names::FULL_FLUSHES, |s| s.full_flushes),
        (names::CACHE_HITS, |s| s.cache_hits),
        (names::CACHE_MISSES, |s| s.cache_misses),
        (names::STORE_QUERIES, |s| s.store_queries),
        (names::RETRIES, |s| s.retries),
        (&names::SERVING_STALE.replace(".", "_"), |s| s.serving_stale),
        (&format!("{}{{reason=\"moved\"}}", names::REJECTIONS), |s| {
            s.rejections("moved")
        }),
    ];
    for (series, of) in counters {
        assert_eq!(sample(&text, series), total(of), "{series}");
    }
    assert_eq!(total(|s| s.serving_stale), 1.0);
    assert_eq!(total(|s| s.rejections("moved")), 1.0);
    assert_eq!(sample(&text, names::VERSION), last as f64);
    assert_eq!(sample(&text, names::WATCHER_CONNECTED), 0.0);
    assert!(
        sample(&text, &format!("{}_count", names::INVALIDATION_LAG)) >= 1.0,
        "the poll timed how old the change it brought was"
    );
}
