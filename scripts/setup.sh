#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine; quick when everything is already there.
# Installs: PostgreSQL 15 server and headers, clang (bindgen), sudo (cargo pgrx test --runas),
# redis-server (the client's shared-cache tests), pgbouncer (the client through a transaction-mode
# pooler), pkg-config, libssl-dev and openssl (the client's feature native-tls and its test
# certificates), fonts-dejavu-core (the benchmarks' SVG charts), valgrind (the benchmarks' instruction
# counts), curl (the demo reads each instance's
# /debug/directory as the guide does), cargo-pgrx 0.18.1, and points pgrx
# at the system PostgreSQL 15.
set -euo pipefail

PGRX_VERSION=0.18.1
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PACKAGES=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo redis-server pgbouncer
  pkg-config libssl-dev openssl fonts-dejavu-core valgrind curl)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
  echo "setup: installing cargo-pgrx $PGRX_VERSION (15-20 minutes on 2 cores)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

if ! grep -qs "^pg15 = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
  cargo pgrx init --pg15 "$PG_CONFIG"
fi
