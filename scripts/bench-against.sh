#!/usr/bin/env bash
# Benchmarks side by side with an earlier revision: this checkout's and REV's builds of the
# benchmarks, each against its own build of the extension in its own copy of PostgreSQL 16
# (.pg/16), run in turn (REV, then this checkout) for BENCH_PAIRS rounds (2), so that both meet
# the same machine. Writes bench/results/against-<REV>.md.
#   bash scripts/bench-against.sh REV [bench...]      (default: lookup replica fanout: the
#                                                      client's hit, its fill, its invalidation)
# The benchmarks' settings (scripts/bench.sh) apply to both sides.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bash scripts/bench-against.sh REV [bench...]}
shift
benches=${*:-lookup replica fanout}
short=$(git rev-parse --short "$rev")
now=$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +)

bash scripts/setup.sh
work=$PWD/target/against
then=$work/$short
[ -d "$then/tree" ] || git worktree add --detach "$then/tree" "$rev"

# Each side: its PostgreSQL tree with its extension, and its benchmarks.
build() { # tree pg
  rm -rf "$2" && cp -a .pg/16 "$2"
  (cd "$1" && PG_CONFIG=$2/bin/pg_config bash scripts/install-extension.sh --release \
    && cargo build -q --release -p shard-directory-bench --bins)
}
build "$then/tree" "$then/pg"
build "$PWD" "$work/pg-now"

results=bench/results/against-$short.md
{
  echo "# $now against $short"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores, PostgreSQL 16 ($(.pg/16/bin/postgres --version));" \
    "command: bash scripts/bench-against.sh $rev $benches; ${BENCH_PAIRS:-2} rounds, $short first in each"
  echo
} > "$results"
for round in $(seq "${BENCH_PAIRS:-2}"); do
  for bench in $benches; do
    for side in "$short:$then/tree/target/release:$then/pg" "$now:$PWD/target/release:$work/pg-now"; do
      IFS=: read -r name bin pg <<< "$side"
      echo "## $bench, $name (round $round)" >> "$results"
      echo >> "$results"
      # Charts and samples (fanout's) into target/, not over the committed ones.
      PG_CONFIG=$pg/bin/pg_config BENCH_RESULTS=$work/$name "$bin/bench_$bench" \
        | tee -a "$results"
      echo >> "$results"
    done
  done
done
echo "results: $results"
