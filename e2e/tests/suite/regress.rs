//! Runs the pg_regress sessions in `tests/pg_regress` (what a DBA sees in psql) against a
//! throwaway cluster, each in a database of its own.

use std::path::Path;

use shard_directory_e2e::Cluster;

#[test]
fn pg_regress_sessions_match_their_expected_output() {
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/pg_regress");
    let mut tests: Vec<String> = std::fs::read_dir(input.join("sql"))
        .expect("tests/pg_regress/sql")
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".sql")
                .map(str::to_owned)
        })
        .collect();
    tests.sort();
    assert!(!tests.is_empty());
    let output = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pg_regress");
    let _ = std::fs::remove_dir_all(&output);
    let cluster = Cluster::start("regress", &[]);
    let failed: Vec<String> = tests
        .iter()
        .filter_map(|test| {
            let (passed, report) = cluster.pg_regress(&input, &output.join(test), test);
            (!passed).then(|| format!("{test}:\n{report}"))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "pg_regress failed (results in {}):\n{}",
        output.display(),
        failed.join("\n")
    );
}
