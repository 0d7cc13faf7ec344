#!/usr/bin/env bash
# The randomized history (e2e/src/history.rs) for as long as asked: runs of new seeds (or the
# seeds given), each a schedule of SD_HISTORY_EVENTS (60) events against the directory while
# routers of every kind write, each judged: every acknowledged write where the surviving
# directory named it, every router converged. scripts/test.sh runs one seed of 40 events.
#   bash scripts/history.sh [minutes]     new seeds until the minutes (default 30) are up
#   SD_HISTORY_SEEDS=7,11 bash scripts/history.sh    those seeds, once each
# A failing run prints its seed and report; run it again with SD_HISTORY_SEEDS=<seed>.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-extension.sh
cargo build -p shard-directory-mover --bin shard-directory --features failpoints
export SD_HISTORY_EVENTS=${SD_HISTORY_EVENTS:-60}
unset RUST_BACKTRACE
run() {
  SD_HISTORY_SEEDS=$1 cargo test -q -p shard-directory-e2e --test suite -- \
    randomized_history:: --nocapture
}
if [ -n "${SD_HISTORY_SEEDS:-}" ]; then
  run "$SD_HISTORY_SEEDS"
  exit
fi
end=$(( $(date +%s) + ${1:-30} * 60 ))
runs=0
while [ "$(date +%s)" -lt "$end" ]; do
  seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  run "$seed"
  runs=$((runs + 1))
done
echo "history: $runs runs, every one held"
