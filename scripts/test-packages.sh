#!/usr/bin/env bash
# Builds the Debian packages (scripts/package.sh) and tests them installed:
#
# - PostgreSQL 15 (Debian's): the extension's files are removed from the system, the 15 package
#   and the CLI package are installed with dpkg -i (their Depends must be met), every
#   shard_directory file of 15 must then be the package's (dpkg -S, dpkg --verify), and
#   /usr/bin/shard-directory must run;
# - PostgreSQL 16, 17, 18 (the trees under .pg/): the extension's files are removed from the
#   tree, and the package's (dpkg-deb -x) copied into the tree's pkglibdir and share/extension;
# - the Python wheel: installed with pip into a virtual environment of its own, and imported;
# - on each major, the smoke tests of e2e/tests/suite/package.rs against throwaway clusters of
#   that major (PG_CONFIG): every release offered and updated to the current version, a directory
#   change notified, a stale write refused with 40001 on a shard that preloads the library.
#
# At the end, also on failure or Ctrl-C, both packages are removed again (dpkg -r) and
# scripts/install-extension.sh installs the extension into the system PostgreSQL 15 as before
# (the package's files are put back in between, so 15 never lacks the extension for long). The
# package's files stay in the .pg/ trees of 16-18 (the same build as install-extension.sh's, in
# release). A postgresql-15-shard-directory or shard-directory package installed before this
# script ran is removed too.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
export USER=${USER:-$(id -un)}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
log() { echo "test-packages: $*" >&2; }
fail() {
  echo "test-packages: FAIL: $*" >&2
  exit 1
}

start=$SECONDS
mapfile -t debs < <(bash scripts/package.sh)
[ ${#debs[@]} -eq 6 ] || fail "scripts/package.sh built ${#debs[@]} packages, not 6"
deb_of() {
  local deb
  for deb in "${debs[@]}"; do
    [[ $(basename "$deb") == "$1"_*_amd64.deb ]] && echo "$deb" && return
  done
  fail "no package $1 among ${debs[*]}"
}

tmp=$(mktemp -d /tmp/sd-test-packages.XXXXXX)
pg15=/usr/lib/postgresql/15/bin/pg_config
lib15=$("$pg15" --pkglibdir)
ext15=$("$pg15" --sharedir)/extension

restore() {
  local status=$?
  trap - EXIT INT TERM
  log "removing the packages and reinstalling the extension into PostgreSQL 15"
  # The package's files, put back unowned right after dpkg -r, until install-extension.sh
  # (which builds first) replaces them: PostgreSQL 15 lacks the extension only for a moment.
  mkdir -p "$tmp/keep/lib" "$tmp/keep/ext"
  cp "$lib15"/shard_directory.so "$tmp/keep/lib/" 2>/dev/null || true
  cp "$ext15"/shard_directory* "$tmp/keep/ext/" 2>/dev/null || true
  as_root dpkg -r postgresql-15-shard-directory shard-directory >&2 || status=1
  if [ -f "$tmp/keep/lib/shard_directory.so" ]; then
    as_root install -m 644 "$tmp"/keep/lib/* "$lib15/"
    as_root install -m 644 "$tmp"/keep/ext/* "$ext15/"
  fi
  bash scripts/install-extension.sh >&2 || status=1
  rm -rf "$tmp"
  log "done in $((SECONDS - start)) s: $([ "$status" = 0 ] && echo ok || echo FAILED)"
  exit "$status"
}
trap restore EXIT
trap 'exit 130' INT TERM

# No file of the extension left in LIBDIR and EXTDIR.
assert_removed() {
  if [ -e "$1/shard_directory.so" ] || compgen -G "$2/shard_directory*" >/dev/null; then
    fail "shard_directory files are left in $1 or $2"
  fi
}

# 15: the system PostgreSQL, by dpkg.
log "PostgreSQL 15: dpkg -i the extension's package and the CLI's"
as_root rm -f "$lib15/shard_directory.so" "$ext15"/shard_directory*
assert_removed "$lib15" "$ext15"
as_root dpkg -i "$(deb_of postgresql-15-shard-directory)" "$(deb_of shard-directory)" >&2
for file in "$lib15/shard_directory.so" "$ext15"/shard_directory*; do
  owner=$(dpkg -S "$file" 2>/dev/null | cut -d: -f1 || true)
  [ "$owner" = postgresql-15-shard-directory ] || fail "$file belongs to '$owner', not the package"
done
for file in shard_directory.control shard_directory--0.1.0.sql sql/shard_directory--*--*.sql; do
  [ -f "$ext15/${file#sql/}" ] || fail "the 15 package lacks ${file#sql/}"
done
as_root dpkg --verify postgresql-15-shard-directory shard-directory ||
  fail "the installed files differ from the packages'"
[ "$(dpkg -S /usr/bin/shard-directory | cut -d: -f1)" = shard-directory ] ||
  fail "/usr/bin/shard-directory is not the CLI package's"
cli_version=$(dpkg-deb -f "$(deb_of shard-directory)" Version)
[ "$(/usr/bin/shard-directory --version)" = "shard-directory $cli_version" ] ||
  fail "/usr/bin/shard-directory --version says '$(/usr/bin/shard-directory --version)'"
/usr/bin/shard-directory --help >/dev/null || fail "/usr/bin/shard-directory --help failed"

# 16, 17, 18: the trees under .pg/, by copying the package's files in.
for major in 16 17 18; do
  pg_config=$PWD/.pg/$major/bin/pg_config
  lib=$("$pg_config" --pkglibdir)
  ext=$("$pg_config" --sharedir)/extension
  log "PostgreSQL $major: the package's files into $lib and $ext"
  rm -f "$lib/shard_directory.so" "$ext"/shard_directory*
  assert_removed "$lib" "$ext"
  dpkg-deb -x "$(deb_of "postgresql-$major-shard-directory")" "$tmp/$major"
  cp "$tmp/$major/usr/lib/postgresql/$major/lib"/* "$lib/"
  cp "$tmp/$major/usr/share/postgresql/$major/extension"/* "$ext/"
  # The tree's extension files are exactly the package's.
  diff <(cd "$tmp/$major/usr/share/postgresql/$major/extension" && ls) <(cd "$ext" && ls shard_directory*) >&2 ||
    fail "PostgreSQL $major: $ext holds other shard_directory files than the package"
  for file in "$tmp/$major/usr/lib/postgresql/$major/lib"/* "$tmp/$major/usr/share/postgresql/$major/extension"/*; do
    case "$file" in
      */lib/*) cmp "$file" "$lib/$(basename "$file")" ;;
      *) cmp "$file" "$ext/$(basename "$file")" ;;
    esac
  done
done

# The smoke tests, on each major.
expected=$(grep -c '^#\[tokio::test\]' e2e/tests/suite/package.rs)
for major in 15 16 17 18; do
  pg_config=/usr/lib/postgresql/15/bin/pg_config
  [ "$major" = 15 ] || pg_config=$PWD/.pg/$major/bin/pg_config
  log "PostgreSQL $major: the smoke tests (e2e/tests/suite/package.rs)"
  PG_CONFIG=$pg_config cargo test -p shard-directory-e2e --test suite -- package:: 2>&1 |
    tee "$tmp/test.log"
  grep -q "^test result: ok\. $expected passed" "$tmp/test.log" ||
    fail "PostgreSQL $major: the smoke tests did not all run and pass ($expected expected)"
done
# The wheel, installed with pip into a virtual environment of its own (its dependencies, psycopg
# and psycopg_pool, from PyPI): it imports, and its Rust part answers.
wheel=$(printf "%s\n" "${debs[@]}" | grep '\.whl$') || fail "no wheel among ${debs[*]}"
python3 -m venv "$tmp/wheel-venv"
"$tmp/wheel-venv/bin/pip" install -q "$wheel"
"$tmp/wheel-venv/bin/python" - <<'PY' || fail "the wheel does not import and answer"
import shard_directory
from shard_directory import _native
assert "assert_directory_version()" in _native.stamp_sql("write")
assert _native.refusal_reason("40001", '{"reason":"frozen"}') == "frozen"
assert issubclass(shard_directory.Rejected, shard_directory.ShardDirectoryError)
PY
log "the wheel: installed with pip, imported"
log "every package passed"
