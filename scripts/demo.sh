#!/usr/bin/env bash
# The main job: the demo scenario against throwaway local clusters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-extension.sh
cargo run -q -p shard-directory-demo --bin demo
