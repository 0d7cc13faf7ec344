//! The main job (`bash scripts/demo.sh`) as a test: the demo exits non-zero when any claim it
//! prints does not hold, so running it here keeps what README shows true.

#[tokio::test]
async fn the_demo_holds_every_claim_it_prints() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_demo"))
        .output()
        .await
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the demo failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("NOT HELD"), "{stdout}");
    assert!(stdout.contains("every claim held"), "{stdout}");
}
