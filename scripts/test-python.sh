#!/usr/bin/env bash
# The Python package's tests (python/): builds it into the virtual environment scripts/setup.sh
# made (maturin develop) and runs pytest on python/tests: the conformance scenarios through the
# package's driver, and the package's own tests on a fleet of throwaway clusters that
# `shard-directory-conformance --fleet 2` lends (the end-to-end suite's harness). Extra arguments
# go to pytest. Ends with a `test result:` line, as cargo's, for scripts/test.sh's count.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$PWD/.venv
[ -x "$venv/bin/maturin" ] || bash scripts/setup.sh
cargo build -p shard-directory-conformance --bin shard-directory-conformance
(cd python && VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH "$venv/bin/maturin" develop --quiet)
log=$(mktemp /tmp/sd-pytest.XXXXXX)
trap 'rm -f "$log"' EXIT
status=0
"$venv/bin/python" -m pytest python/tests -v -p no:cacheprovider "$@" 2>&1 | tee "$log" ||
  status=$?
passed=$(grep -oE '[0-9]+ passed' "$log" | tail -1 | grep -oE '[0-9]+' || echo 0)
failed=$(grep -oE '[0-9]+ (failed|error)' "$log" | tail -1 | grep -oE '[0-9]+' || echo 0)
[ "$status" = 0 ] && result=ok || result=FAILED
echo "test result: $result. $passed passed; $failed failed (pytest python/tests)"
exit "$status"
