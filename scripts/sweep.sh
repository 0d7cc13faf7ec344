#!/usr/bin/env bash
# The whole failpoint sweep (e2e/tests/suite/sweep.rs): every step of every kind of move faulted
# every way (killed, failing, stalled past the lease, each server restarted or its sessions
# ended there), each case checked for a move's three invariants. About 35 minutes on 2 cores;
# scripts/test.sh runs a daily rotating share of it. One case: SD_SWEEP_CASE=<scenario/point/fault>
# (as a failure names it); its commands and output: SD_SWEEP_VERBOSE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-extension.sh
cargo build -p shard-directory-mover --bin shard-directory --features failpoints
export SD_SWEEP=${SD_SWEEP:-all}
unset RUST_BACKTRACE
cargo test -p shard-directory-e2e --test suite -- sweep:: --nocapture
