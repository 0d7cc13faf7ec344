#!/usr/bin/env bash
# Builds the extension (no test functions) and installs it into the system PostgreSQL 15, where
# the throwaway clusters of the demo, the end-to-end tests and the benchmarks find it.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
if [ "$(id -u)" = 0 ]; then
  cargo pgrx install --pg-config "$PG_CONFIG" "$@"
else
  cargo pgrx install --sudo --pg-config "$PG_CONFIG" "$@"
fi
