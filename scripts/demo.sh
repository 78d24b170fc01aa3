#!/usr/bin/env bash
# The demo: installs what is missing, starts a local broker, runs
# `reconciler demo` against it and stops the broker.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/env.sh
scripts/setup.sh

export BROKER_PORT=${BROKER_PORT:-9092}
scripts/broker.sh start sqlite
trap 'scripts/broker.sh stop' EXIT
cargo run --release --locked --quiet -- demo --brokers "127.0.0.1:$BROKER_PORT" "$@"
