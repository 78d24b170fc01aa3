#!/usr/bin/env bash
# End-to-end benchmark (see benches/e2e.rs): builds the release binary,
# starts Apache Kafka (scripts/broker.sh) on $BROKER_PORT (19392 by
# default), runs the harness, stops the broker. Output goes to stdout.
#
#   scripts/bench-e2e.sh                       # 300,000 operations ≈ 1.07M records
#   E2E_OPERATIONS=30000 E2E_LATENCY_SECS=10 scripts/bench-e2e.sh
#   E2E_EXACTLY_ONCE=1 scripts/bench-e2e.sh   # exactly_once vs at_least_once too
#   scripts/bench-e2e.sh memory                # on another broker (scripts/broker.sh engines)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/env.sh
export BROKER_PORT=${BROKER_PORT:-19392}
cargo build --release --locked --bin reconciler
# A private copy: the shared target directory's binary may be replaced by
# another build (another worktree) while the benchmark runs.
mkdir -p .run
cp "$CARGO_TARGET_DIR/release/reconciler" .run/reconciler-bench
export E2E_BIN=$ROOT/.run/reconciler-bench
cargo bench --locked --bench e2e --no-run
engine=${1:-kafka}
scripts/broker.sh start "$engine"
trap 'scripts/broker.sh stop' EXIT
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
KAFKA_BROKERS=127.0.0.1:$BROKER_PORT cargo bench --locked --bench e2e
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
