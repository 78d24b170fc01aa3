#!/usr/bin/env bash
# Builds the release binary: the one build command shared by the tests
# (scripts/test.sh), the demo and the container image (Dockerfile), so what
# CI proves is what ships. Release only: RocksDB and librdkafka are too slow
# to build in two profiles.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/env.sh
cargo build --release --locked --bin reconciler
echo "$CARGO_TARGET_DIR/release/reconciler"
