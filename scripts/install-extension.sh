#!/usr/bin/env bash
# Builds the extension (no test functions) and installs it into the system PostgreSQL 15 (or the
# one PG_CONFIG names, built for its major), where the throwaway clusters of the demo, the
# end-to-end tests and the benchmarks find it. cargo pgrx
# installs the current version's script and the upgrade scripts (sql/shard_directory--A--B.sql);
# the install scripts of earlier releases (sql/shard_directory--A.sql) are copied here, so that
# CREATE EXTENSION ... VERSION 'A' and the upgrade path from it work.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if [ "$(id -u)" = 0 ]; then
  cargo pgrx install --pg-config "$PG_CONFIG" "$@"
else
  cargo pgrx install --sudo --pg-config "$PG_CONFIG" "$@"
fi
for script in sql/shard_directory--*.sql; do
  case "$script" in *--*--*) continue ;; esac  # upgrade scripts: cargo pgrx copied them
  as_root install -m 644 "$script" "$("$PG_CONFIG" --sharedir)/extension/"
done
