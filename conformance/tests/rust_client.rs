//! The Rust client passes every shipped scenario, through its driver.

/// Each scenario on a fleet of its own, one after the other (each stops and starts servers of
/// its own only).
#[tokio::test(flavor = "multi_thread")]
async fn the_rust_client_passes_every_scenario() {
    let driver = env!("CARGO_BIN_EXE_shard-directory-conformance-rust");
    let scenarios = shard_directory_conformance::load(&shard_directory_conformance::shipped())
        .expect("the shipped scenarios");
    let mut failed = Vec::new();
    for s in &scenarios {
        if let Err(e) = shard_directory_conformance::run(s, driver).await {
            failed.push(e.to_string());
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
