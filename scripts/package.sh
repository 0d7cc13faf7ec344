#!/usr/bin/env bash
# Builds the Debian packages into target/packages/ and prints their paths (one a line, on stdout;
# the build's progress goes to stderr):
#
#   postgresql-NN-shard-directory_<version>_amd64.deb, NN = 15 16 17 18 (or the majors given as
#     arguments): the extension for PostgreSQL NN at Debian's paths: the library
#     (/usr/lib/postgresql/NN/lib/shard_directory.so), the control file, the install script
#     cargo pgrx generates (shard_directory--<version>.sql), every upgrade script
#     (sql/shard_directory--A--B.sql) and the install scripts of earlier releases
#     (sql/shard_directory--A.sql), under /usr/share/postgresql/NN/extension/;
#   shard-directory_<version>_amd64.deb: the CLI, /usr/bin/shard-directory (release build);
#   shard_directory-<version>-cp311-abi3-<platform>.whl: the Python package (python/), built by
#     maturin (release).
#
# Each extension package is built as pgrx extensions ship: `cargo pgrx package --pg-config` of
# that major (a release build with the Cargo feature pgNN), which lays the files out under that
# pg_config's own directories (for 16-18 the trees scripts/setup.sh unpacked under .pg/NN); they
# are moved to Debian's paths here. Libraries are stripped as dh_strip does; Depends is
# postgresql-NN plus what dpkg-shlibdeps reads from the ELF files (a throwaway debian/control is
# all it needs); the copyright file (DEP-5) carries LICENSE. Templates: packaging/.
#
# Idempotent: every run rebuilds the staging trees and the .deb files from scratch; cargo skips
# what is already built. The majors share target/release: cargo keeps each major's pgrx-pg-sys
# apart, but the extension crate itself (a cdylib, one artifact) is recompiled when the major
# changes (10-25 s on two cores), so a warm run takes about a minute; the major target/release
# already holds is built first, without a recompile.
set -euo pipefail
shopt -s inherit_errexit # a failure inside $(...) stops the script too
cd "$(dirname "$0")/.."
# Its own set-up, as demo.sh and test.sh do (the PostgreSQL 16-18 trees under .pg/, dpkg-dev,
# cargo-pgrx); quick when everything is there. Its output goes to stderr: stdout is the paths.
bash scripts/setup.sh >&2
umask 022
export LC_ALL=C
root_dir=$PWD
# shellcheck source=../packaging/metadata.sh
source packaging/metadata.sh

majors=("$@")
[ ${#majors[@]} -gt 0 ] || majors=(15 16 17 18)

log() { echo "package: $*" >&2; }
die() { echo "package: $*" >&2; exit 1; }

for tool in dpkg-deb dpkg-shlibdeps strip python3; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/setup.sh should have installed it)"
done

pg_config_of() {
  case $1 in
    15) echo /usr/lib/postgresql/15/bin/pg_config ;;
    *) echo "$root_dir/.pg/$1/bin/pg_config" ;;
  esac
}

# The versions of the extension and the CLI, and cargo's target directory.
read -r ext_version cli_version target_dir < <(
  cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
v = {p["name"]: p["version"] for p in m["packages"]}
print(v["shard_directory"], v["shard-directory-mover"], m["target_directory"])'
)
out=$target_dir/packages
build=$out/build
mkdir -p "$out" "$build"

copyright=$(grep -m1 '^Copyright (c) ' LICENSE | sed 's/^Copyright (c) //')
[ -n "$copyright" ] || die "LICENSE has no 'Copyright (c) ...' line"
# LICENSE without its title line, as a DEP-5 license text: each line indented, blank lines " .".
license_text=$(tail -n +2 LICENSE | sed -e '/./,$!d' | sed -e 's/^$/./' -e 's/^/ /')

# render TEMPLATE KEY=VALUE...: TEMPLATE with every @KEY@ replaced by VALUE (taken literally).
render() {
  local template=$1
  shift
  python3 - "$template" "$@" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
for pair in sys.argv[2:]:
    key, value = pair.split("=", 1)
    text = text.replace("@" + key + "@", value)
left = re.findall(r"@[A-Z_]+@", text)
assert not left, f"{sys.argv[1]}: {left} not replaced"
sys.stdout.write(text)
EOF
}

# shlibs STAGE PACKAGE FILE...: the Depends dpkg-shlibdeps computes for FILEs, which are staged
# under STAGE/debian/PACKAGE/ (where it expects them, beside a minimal debian/control).
shlibs() {
  local stage=$1 package=$2
  shift 2
  printf 'Source: shard-directory\n\nPackage: %s\nArchitecture: amd64\n' "$package" \
    >"$stage/debian/control"
  mkdir -p "$stage/debian/$package/DEBIAN" # how it recognises the package's tree
  local found
  found=$(cd "$stage" && dpkg-shlibdeps -O "${@/#/-e}")
  found=${found#shlibs:Depends=}
  [ -n "$found" ] || die "dpkg-shlibdeps found no dependency of $*"
  echo "$found"
}

# deb STAGE PACKAGE VERSION TEMPLATE DEPENDS: writes the control file, the copyright file and
# md5sums for the tree STAGE/debian/PACKAGE and builds it into $out; prints the .deb's path.
deb() {
  local stage=$1 package=$2 version=$3 template=$4 depends=$5
  local tree=$stage/debian/$package file=$out/${package}_${version}_amd64.deb
  local doc=$tree/usr/share/doc/$package
  mkdir -p "$doc" "$tree/DEBIAN"
  render packaging/copyright.in "MAINTAINER=$DEB_MAINTAINER" "COPYRIGHT=$copyright" \
    "LICENSE_TEXT=$license_text" >"$doc/copyright"
  chmod 644 "$doc/copyright"
  (cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
    xargs -0 md5sum) >"$tree/DEBIAN/md5sums"
  render "$template" "VERSION=$version" "MAINTAINER=$DEB_MAINTAINER" "DEPENDS=$depends" \
    "INSTALLED_SIZE=$(du -sk --exclude=DEBIAN "$tree" | cut -f1)" \
    "MAJOR=${major:-}" >"$tree/DEBIAN/control"
  chmod 644 "$tree/DEBIAN/control" "$tree/DEBIAN/md5sums"
  rm -f "$file"
  # xz at level 1: a tenth of the default's (6) time for a package 12% larger.
  dpkg-deb --root-owner-group -Zxz -z1 --build "$tree" "$file" >&2
  echo "$file"
}

# Strips debugging symbols and the .comment and .note sections, as dh_strip does.
strip_elf() { strip --remove-section=.comment --remove-section=.note "$@"; }

# Start with the major target/release holds the extension's build for: it is not recompiled
# then. Read from cargo's fingerprint (an internal file: if its format changes, the order is
# simply the one given).
last=$(grep -ho '"features":"\[\\"pg[0-9]*' \
  "$target_dir"/release/.fingerprint/shard_directory-*/lib-shard_directory.json 2>/dev/null |
  grep -o '[0-9]*$' | head -n1 || true)
if [ -n "$last" ] && [[ " ${majors[*]} " == *" $last "* ]]; then
  ordered=("$last")
  for major in "${majors[@]}"; do [ "$major" = "$last" ] || ordered+=("$major"); done
  majors=("${ordered[@]}")
fi

start=$SECONDS
built=()

for major in "${majors[@]}"; do
  pg_config=$(pg_config_of "$major")
  [ -x "$pg_config" ] || die "$pg_config is missing (bash scripts/setup.sh)"
  found=$("$pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
  [ "$found" = "$major" ] || die "$pg_config is PostgreSQL $found, not $major"
  package=postgresql-$major-shard-directory
  stage=$build/pg$major
  rm -rf "$stage"
  mkdir -p "$stage/debian"

  log "PostgreSQL $major: cargo pgrx package --pg-config $pg_config"
  t=$SECONDS
  cargo pgrx package --pg-config "$pg_config" --no-default-features --features "pg$major" \
    --out-dir "$stage/pgrx" >&2
  log "PostgreSQL $major: built in $((SECONDS - t)) s"

  # cargo pgrx laid the files out under the pg_config's own directories: move them to Debian's.
  pgrx_lib=$stage/pgrx$("$pg_config" --pkglibdir)
  pgrx_ext=$stage/pgrx$("$pg_config" --sharedir)/extension
  unexpected=$(find "$stage/pgrx" -type f ! -path "$pgrx_lib/*" ! -path "$pgrx_ext/*")
  [ -z "$unexpected" ] || die "cargo pgrx package wrote files this script does not place: $unexpected"
  tree=$stage/debian/$package
  lib=$tree/usr/lib/postgresql/$major/lib
  ext=$tree/usr/share/postgresql/$major/extension
  install -d "$lib" "$ext"
  install -m 644 "$pgrx_lib/shard_directory.so" "$lib/"
  strip_elf --strip-unneeded "$lib/shard_directory.so"
  install -m 644 "$pgrx_ext"/* "$ext/"
  # The install scripts of earlier releases (CREATE EXTENSION ... VERSION 'A', and the upgrade
  # path from A); cargo pgrx copies only the upgrade scripts.
  for script in sql/shard_directory--*.sql; do
    case "$script" in
      *--*--*) ;;
      "sql/shard_directory--$ext_version.sql") ;;
      *) install -m 644 "$script" "$ext/" ;;
    esac
  done
  for need in shard_directory.control "shard_directory--$ext_version.sql" \
    sql/shard_directory--*.sql; do
    [ -f "$ext/${need#sql/}" ] || die "PostgreSQL $major: ${need#sql/} is not in the package"
  done
  grep -q "^default_version = '$ext_version'" "$ext/shard_directory.control" ||
    die "PostgreSQL $major: the control file's default_version is not $ext_version"

  depends="postgresql-$major, $(shlibs "$stage" "$package" "debian/$package/usr/lib/postgresql/$major/lib/shard_directory.so")"
  built+=("$(deb "$stage" "$package" "$ext_version" packaging/extension.control.in "$depends")")
done

# The CLI.
unset major
package=shard-directory
stage=$build/cli
rm -rf "$stage"
mkdir -p "$stage/debian/$package/usr/bin"
log "CLI: cargo build --release -p shard-directory-mover --bin shard-directory"
t=$SECONDS
cargo build --release -p shard-directory-mover --bin shard-directory
log "CLI: built in $((SECONDS - t)) s"
install -m 755 "$target_dir/release/shard-directory" "$stage/debian/$package/usr/bin/"
strip_elf "$stage/debian/$package/usr/bin/shard-directory"
depends=$(shlibs "$stage" "$package" "debian/$package/usr/bin/shard-directory")
# What dpkg-shlibdeps found must cover every library ldd lists (libssl3: native-tls links
# OpenSSL; libm is libc6's).
while read -r soname path; do
  for candidate in "$path" "/usr${path#/usr}" "${path#/usr}"; do # /lib is /usr/lib
    owner=$(dpkg -S "$candidate" 2>/dev/null | sed -n '1s/:.*//p' || true)
    [ -z "$owner" ] || break
  done
  [ -n "$owner" ] || die "CLI: no package owns $path ($soname)"
  [[ ", $depends" == *", $owner "* ]] || die "CLI: $soname ($owner) is not in Depends: $depends"
done < <(ldd "$stage/debian/$package/usr/bin/shard-directory" | awk '$2 == "=>" { print $1, $3 }')
built+=("$(deb "$stage" "$package" "$cli_version" packaging/cli.control.in "$depends")")

# The Python package: a wheel for CPython 3.11 and later (abi3), built by maturin.
log "Python: maturin build --release (python/)"
t=$SECONDS
[ -x .venv/bin/maturin ] || die "no .venv/bin/maturin: scripts/setup.sh makes it"
wheels=$build/wheel
rm -rf "$wheels"
(cd python && ../.venv/bin/maturin build --release --quiet --out "$wheels" >&2)
wheel=$(find "$wheels" -name 'shard_directory-*.whl')
[ -n "$wheel" ] || die "Python: maturin built no wheel"
install -m 644 "$wheel" "$out/"
built+=("$out/$(basename "$wheel")")
log "Python: built in $((SECONDS - t)) s"

log "built ${#built[@]} packages in $((SECONDS - start)) s"
printf "%s\n" "${built[@]}" | sort
