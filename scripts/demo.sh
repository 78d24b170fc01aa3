#!/usr/bin/env bash
# The demo: installs what is missing, starts a local broker (noida-db, the
# one that builds fastest), runs `reconciler demo` against it, prints its
# summary and keeps the pipeline and its exception panel up until Ctrl-C;
# then stops everything it started.
#
#   scripts/demo.sh              summary, then the panel until Ctrl-C
#   DEMO_EXIT=1 scripts/demo.sh  exit right after the summary (scripts, CI)
#   scripts/demo.sh --copies 5   more of each story (arguments go to `reconciler demo`)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/env.sh
began=$(date +%s)
step() { echo "==> [$(( $(date +%s) - began )) s] $*"; }

step "Checking the build packages and the broker (a fresh machine: apt-get for what is missing, then about 1 minute for noida-db; then nothing)"
scripts/setup.sh

step "Building reconciler (a fresh 2-core machine: about 13 minutes, most of it RocksDB and librdkafka; then seconds)"
cargo build --release --locked --bin reconciler

export BROKER_PORT=${BROKER_PORT:-9092}
step "Starting noida-db on 127.0.0.1:$BROKER_PORT"
scripts/broker.sh start noida
trap 'scripts/broker.sh stop' EXIT

exit_flag=()
[ "${DEMO_EXIT:-0}" = 1 ] && exit_flag=(--exit)
step "Running the demo (about 10 seconds to the summary)"
"$CARGO_TARGET_DIR/release/reconciler" demo --brokers "127.0.0.1:$BROKER_PORT" "${exit_flag[@]}" "$@"
