#!/usr/bin/env bash
# Benchmarks: the shard-side check under pgbench (no check vs the guide's PL/pgSQL vs native).
# BENCH_SECONDS, BENCH_ROUNDS, BENCH_CLIENTS tune it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-extension.sh --release
cargo run -q --release -p shard-directory-e2e --bin bench_check
