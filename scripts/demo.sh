#!/usr/bin/env bash
# The demo: installs what is missing, starts a local broker (Apache Kafka
# unless --broker says otherwise), runs `reconciler demo` against it,
# prints its summary and keeps the pipeline and its exception panel up
# until Ctrl-C; then stops everything it started.
#
#   scripts/demo.sh                  summary, then the panel until Ctrl-C
#   DEMO_EXIT=1 scripts/demo.sh      exit right after the summary (scripts, CI)
#   scripts/demo.sh --copies 5       more of each story (arguments go to `reconciler demo`)
#   scripts/demo.sh --broker noida   on noida-db 0.2.3, a small Kafka-protocol broker
#                                    (no Java needed; about 1 minute to build)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/env.sh
began=$(date +%s)
step() { echo "==> [$(( $(date +%s) - began )) s] $*"; }

broker=kafka
if [ "${1:-}" = --broker ]; then
  broker=${2:?--broker kafka|noida}
  shift 2
fi
case "$broker" in
  kafka) what="Apache Kafka" ;;
  noida) what="noida-db" ;;
  *) echo "--broker kafka|noida, not $broker" >&2; exit 2 ;;
esac

step "Checking the build packages and $what (a fresh machine: apt-get for what is missing, then about 15 s for Apache Kafka's jars; then nothing)"
if [ "$broker" = kafka ]; then
  scripts/setup.sh
else
  scripts/setup.sh --build
  scripts/broker.sh install "$broker"
fi

step "Building reconciler (a fresh 2-core machine: about 15 minutes, most of it RocksDB and librdkafka; then seconds)"
cargo build --release --locked --bin reconciler

export BROKER_PORT=${BROKER_PORT:-9092}
step "Starting $what on 127.0.0.1:$BROKER_PORT"
scripts/broker.sh start "$broker"
trap 'scripts/broker.sh stop' EXIT

exit_flag=()
[ "${DEMO_EXIT:-0}" = 1 ] && exit_flag=(--exit)
step "Running the demo (about 10 seconds to the summary)"
"$CARGO_TARGET_DIR/release/reconciler" demo --brokers "127.0.0.1:$BROKER_PORT" "${exit_flag[@]}" "$@"
