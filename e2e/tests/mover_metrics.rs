//! A move's metrics reach the recorder the program installs (here the Prometheus exporter, as
//! the CLI's `--metrics-addr` installs it): the phases entered, the freeze, rows per table and
//! the WAL the slot kept. One test per binary: the recorder is global.

use metrics_exporter_prometheus::PrometheusBuilder;
use shard_directory_e2e::prometheus::sample;
use shard_directory_e2e::Topology;
use shard_directory_mover::{EntityKey, Method, MethodChoice, MoveOptions};

#[tokio::test]
async fn a_moves_phases_freeze_rows_and_retained_wal_reach_the_recorder() {
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder in this test binary");
    let t = Topology::start("movemetrics").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 5, 2).await;
    let record = t
        .mover(MoveOptions {
            method: MethodChoice::Logical,
            ..Default::default()
        })
        .start(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let text = prometheus.render();
    for phase in Method::Logical.phases().iter().map(|p| p.as_str()) {
        assert_eq!(
            sample(
                &text,
                &format!("shard_directory_move_phases_total{{phase=\"{phase}\"}}")
            ),
            1.0,
            "{phase}"
        );
    }
    assert_eq!(
        sample(&text, "shard_directory_move_freeze_seconds_count"),
        1.0
    );
    let id = record.move_id;
    for (table, rows) in [("public.orders", 5.0), ("public.order_lines", 10.0)] {
        let labels = format!("{{move_id=\"{id}\",table=\"{table}\"}}");
        assert_eq!(
            sample(&text, &format!("shard_directory_move_rows_total{labels}")),
            rows
        );
        // the last report is of the source's rows deleted
        assert_eq!(
            sample(&text, &format!("shard_directory_move_rows_done{labels}")),
            rows
        );
    }
    assert!(
        sample(
            &text,
            &format!("shard_directory_move_retained_wal_bytes{{move_id=\"{id}\"}}")
        ) >= 0.0
    );
}
