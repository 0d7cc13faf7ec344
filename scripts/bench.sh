#!/usr/bin/env bash
# Benchmarks, each side by side in one run:
#   check      the shard-side check under pgbench: no check vs the guide's PL/pgSQL vs native; entity_stats off vs on (instructions)
#   move       a 100k-row tenant moved by logical vs copy (the copy against a plain COPY), and --reversible vs its revert
#   freeze     a move's freeze by tenant size (100k, 1M, 10M rows): logical with and without the online check vs copy; chart freeze.svg
#   throttle   another tenant's write latency on the source: no move vs a move vs a paced move
#   drain      a shard of 200 tenants of mixed sizes drained by a plan: --parallel 1 vs 2
#   directory  one entry's UPDATE: plain table vs the guide's PL/pgSQL trigger vs the extension
#   churn      cache hit rate while tenants are inserted: invalidation by entity vs full flush
#   shared     the shared (Redis) cache's hit rate for fresh instances under the same churn
#   replica    the directory primary's CPU per lookup miss, without and with a read replica
#   lookup     a cache hit against a Mutex<HashMap> of the same entries
#   fanout     COMMIT to every one of N client instances (over 4 processes) knowing the version
#   poll       the read every instance makes per change: the version row vs changes_since()
#   recovery   a write on a stale route (moved, re-pointed) to its committed retry vs a current one
#   router     the Rust client's routed one-row transaction vs the same stamped by hand (plain COMMIT,
#              the router's COMMIT) vs an unstamped one
#   python     the Python package: a cached lookup vs the guide's dict and the Rust client; a routed
#              one-row transaction vs the same on a plain psycopg connection
# No argument runs them all. --quick runs each for a few seconds at smaller sizes (a few minutes
# in all). Every run writes its output, with the date and the machine, to
# bench/results/results.md, and `fanout` its samples and a chart (bench/results/fanout.{csv,svg});
# --quick writes under bench/results/quick/ instead.
# Settings: BENCH_SECONDS, BENCH_ROUNDS (check, directory, replica, python; BENCH_SECONDS also churn, shared), BENCH_CLIENTS
# (check), BENCH_MOVES (move, freeze), BENCH_SIZES (freeze), BENCH_TENANTS and BENCH_METHOD (drain), BENCH_ROWS and BENCH_MAX_RATE (throttle), BENCH_ENTRIES (churn, shared, replica; lookup: sizes, comma-separated; python: the first),
# BENCH_INSERTS (churn, shared), BENCH_LOOKUPS (shared, replica), BENCH_INSTANCES and BENCH_CHANGES (fanout), BENCH_TRIALS (recovery).
set -euo pipefail
cd "$(dirname "$0")/.."

export BENCH_RESULTS=results
if [ "${1:-}" = --quick ]; then
  shift
  export BENCH_RESULTS=results/quick
  export BENCH_SECONDS=${BENCH_SECONDS:-3} BENCH_ROUNDS=${BENCH_ROUNDS:-1} BENCH_MOVES=${BENCH_MOVES:-1}
  export BENCH_ENTRIES=${BENCH_ENTRIES:-100000} BENCH_CHANGES=${BENCH_CHANGES:-50}
  export BENCH_INSTANCES=${BENCH_INSTANCES:-1,16,64} BENCH_TRIALS=${BENCH_TRIALS:-10}
  export BENCH_TENANTS=${BENCH_TENANTS:-40}
fi

bash scripts/setup.sh
bash scripts/install-extension.sh --release
cargo build -q --release -p shard-directory-bench --bins
# The Python package, built in release into .venv, for `python`.
(cd python && VIRTUAL_ENV=$PWD/../.venv PATH=$PWD/../.venv/bin:$PATH ../.venv/bin/maturin develop --release --quiet)

results=bench/$BENCH_RESULTS/results.md
mkdir -p "bench/$BENCH_RESULTS"
{
  echo "# Benchmark results"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/^Mem:/ {print $2}') GiB;" \
    "$(/usr/lib/postgresql/15/bin/postgres --version); $(rustc --version | cut -d' ' -f1-2)"
  echo "Command: bash scripts/bench.sh $( [ "$BENCH_RESULTS" = results/quick ] && echo '--quick ')${*:-}"
  echo
} > "$results"
for bench in ${@:-check move freeze throttle drain directory churn shared replica lookup fanout poll recovery router python}; do
  echo "## $bench" >> "$results"
  echo >> "$results"
  "target/release/bench_$bench" | tee -a "$results"
  echo >> "$results"
done
echo "results: $results"
