#!/usr/bin/env bash
# Runs every test: formatting and lints, the extension's #[pg_test]s on PostgreSQL 15, 16, 17 and
# 18, then (on 15, and the mixed fleet on 15, 17 and 18) the end-to-end suite
# (throwaway clusters + real client connections + the mover and its CLI), the upgrade check and
# the pg_regress sessions (again on 16, 17 and 18).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export USER=${USER:-$(id -un)}
# A run from a clean clone gains nothing from incremental caches, which would double target/.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# Clusters, builds and packages all need disk; a full disk fails far from its cause.
free_disk() { df -Ph . /tmp | awk -v at="$1" 'NR > 1 && !seen[$6]++ { print "disk " at ": " $4 " free on " $6 }'; }
free_disk "at the start"
log=$(mktemp /tmp/sd-test-log.XXXXXX)

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The extension's code for the other majors (#[cfg(feature = "pgNN")]).
for major in 16 17 18; do
  cargo clippy -p shard_directory --no-default-features --features "pg$major" --all-targets \
    -- -D warnings
done
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

# #[pg_test]s on every supported major (15: Debian's; 16-18: the trees setup.sh unpacked under
# .pg/): cargo-pgrx builds the extension for it and starts its own cluster. Postgres will not
# run as root.
pgdata=$(mktemp -d /tmp/sd-pgrx-test.XXXXXX)
trap 'rm -rf "$pgdata" "$log"' EXIT
for major in 15 16 17 18; do
  if [ "$(id -u)" = 0 ]; then
    rm -rf "${pgdata:?}"/* && chown postgres: "$pgdata"
    cargo pgrx test "pg$major" --runas postgres --pgdata "$pgdata" 2>&1 | tee -a "$log"
  else
    cargo pgrx test "pg$major" 2>&1 | tee -a "$log"
  fi
done

# The extension into every major's tree: the mixed fleet (mixed_fleet.rs) runs clusters of 15,
# 17 and 18 side by side.
bash scripts/install-extension.sh
for major in 16 17 18; do
  PG_CONFIG=$PWD/.pg/$major/bin/pg_config bash scripts/install-extension.sh
done
# The end-to-end tests run the CLI as an operator would (and SIGKILL it mid-move); built with
# its failpoints (inert unless FAILPOINTS names one), which the failpoint sweep (sweep.rs) faults.
# The sweep runs a share of its cases that rotates daily; scripts/sweep.sh runs them all.
cargo build -p shard-directory-mover --bin shard-directory --features failpoints
# --show-output: the proof prints its counts (acked, retried by reason, moves, freeze, the kill).
cargo test -p shard-directory-e2e -p shard-directory-demo -p shard-directory-client \
  -p shard-directory-mover -p shard-directory-relay -p shard-directory-connect \
  -p shard-directory-conformance \
  -p shard-directory-protocol --features shard-directory-protocol/serde \
  -- --show-output 2>&1 | tee -a "$log"

free_disk "after the end-to-end suite"

# The Python package (python/): built with maturin, its pytest suite (the conformance scenarios
# through its driver, and its own tests).
bash scripts/test-python.sh 2>&1 | tee -a "$log"

# pg_regress and the upgrade check on 16, 17 and 18: the suite's clusters made from each tree
# (PG_CONFIG).
for major in 16 17 18; do
  PG_CONFIG=$PWD/.pg/$major/bin/pg_config cargo test -p shard-directory-e2e --test suite \
    -- regress:: upgrade:: 2>&1 | tee -a "$log"
done

# The loom model of the client cache's invariant (client/src/cache.rs, `loom_model`): a build of
# its own (the cfg swaps the cache's atomics and map for loom's), kept apart from target/.
RUSTFLAGS="--cfg sd_loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p shard-directory-client --lib --release loom 2>&1 | tee -a "$log"

# The Debian packages (scripts/package.sh), installed: dpkg -i into the system PostgreSQL 15,
# unpacked into the 16-18 trees, and smoke-tested on each (e2e/tests/suite/package.rs).
bash scripts/test-packages.sh 2>&1 | tee -a "$log"

# One closing line for the whole run (#[pg_test]s, unit, end-to-end, pg_regress and doc tests).
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
