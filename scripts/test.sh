#!/usr/bin/env bash
# Runs every test: formatting and lints, the extension's #[pg_test]s, then the end-to-end suite
# (throwaway clusters + real client connections) and the pg_regress sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export USER=${USER:-$(id -un)}

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

# #[pg_test]s: cargo-pgrx starts its own cluster. Postgres will not run as root.
pgdata=$(mktemp -d /tmp/sd-pgrx-test.XXXXXX)
trap 'rm -rf "$pgdata"' EXIT
if [ "$(id -u)" = 0 ]; then
  chown postgres: "$pgdata"
  cargo pgrx test pg15 --runas postgres --pgdata "$pgdata"
else
  cargo pgrx test pg15
fi

bash scripts/install-extension.sh
cargo test -p shard-directory-e2e -p shard-directory-client
