#!/usr/bin/env bash
# SQLsmith against the shard's check (e2e/tests/suite/shard_fuzz.rs) for as long as asked, with
# new seeds: bash scripts/fuzz.sh [seconds, default 600] [first seed, default random]. Prints the
# statements run, the crashes and the fenced rows written; a crash or a fenced row fails the run
# and names the statement (make it a regression test in e2e/tests/suite/shard_sql.rs).
# scripts/test.sh runs a bounded share with fixed seeds. Another PostgreSQL: PG_CONFIG.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-extension.sh
export SD_FUZZ_SECONDS=${1:-600}
export SD_FUZZ_SEEDS=${2:-$(( (RANDOM << 15) | RANDOM ))}
export SD_FUZZ_QUERIES=${SD_FUZZ_QUERIES:-5000}
unset RUST_BACKTRACE
echo "fuzz: ${SD_FUZZ_SECONDS} s from seed ${SD_FUZZ_SEEDS}, ${SD_FUZZ_QUERIES} statements a seed"
cargo test -p shard-directory-e2e --test suite -- shard_fuzz:: --nocapture
