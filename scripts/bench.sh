#!/usr/bin/env bash
# Benchmarks, each side by side in one run: `check` (the shard-side check under pgbench: no check
# vs the guide's PL/pgSQL vs native), `move` (a 100k-row tenant moved by logical vs copy, and the
# copy against a plain COPY), `directory` (one entry's UPDATE: plain table vs the guide's PL/pgSQL
# trigger vs the extension, at 1 and 2 clients), `churn` (cache hit rate while tenants are inserted:
# invalidation by entity vs full flush), `lookup` (a cache hit against a Mutex<HashMap>). No
# argument runs them all.
# BENCH_SECONDS, BENCH_ROUNDS tune `check` and `directory`, BENCH_CLIENTS `check`; BENCH_MOVES tunes `move`;
# BENCH_ENTRIES, BENCH_SECONDS and BENCH_INSERTS tune `churn`; BENCH_ENTRIES (sizes, comma-separated) `lookup`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-extension.sh --release
for bench in "${@:-check move directory churn lookup}"; do
  for b in $bench; do
    cargo run -q --release -p shard-directory-e2e --bin "bench_$b"
  done
done
