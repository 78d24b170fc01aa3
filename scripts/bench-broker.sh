#!/usr/bin/env bash
# The test broker's own cost at a constant rate, with no reconciler: what
# the latency step of benches/e2e.rs stands on.
#
#   scripts/bench-broker.sh                  # Apache Kafka, 60,000 records/s
#   BROKER_RATE=30000 scripts/bench-broker.sh
#   BROKER_RATE=15000 scripts/bench-broker.sh noida    # another broker (scripts/broker.sh engines)
#
# Two runs on a fresh broker each: loadgen publishes the 300,000-operation
# workload (1,072,283 records) at BROKER_RATE; in the second run
# `loadgen passthrough` follows the topic as the pipeline does (its
# consumer settings; it waits for the topic if it starts first) and
# produces each record again to bench.broker.copy, a second produce stream
# as large as the first. Every 3 s while the publisher runs, the broker's
# CPU (/proc/PID/stat, user + system) is printed as a share of one core.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
engine=${1:-kafka}
rate=${BROKER_RATE:-60000}
export BROKER_PORT=${BROKER_PORT:-19692}
bench_start broker "$engine"
bench_kafka_toml broker > "$work/reconciler.toml"
hz=$(getconf CLK_TCK)

run_once() {
  local follow=$1 pid_broker publisher copier prev now t=0
  pid_broker=$(scripts/broker.sh pid)
  broker_ticks() { awk '{print $14 + $15}' "/proc/$pid_broker/stat"; }
  "$bin" loadgen --config "$work/reconciler.toml" --operations 300000 --rate "$rate" --event-time now \
    --truth "$work/truth.json" > "$work/loadgen.log" 2>&1 &
  publisher=$!
  if [ "$follow" = yes ]; then
    "$bin" loadgen passthrough --config "$work/reconciler.toml" --to bench.broker.copy --count 1072283 \
      > "$work/copy.log" 2>&1 &
    copier=$!
  fi
  prev=$(broker_ticks)
  while kill -0 "$publisher" 2>/dev/null; do
    sleep 3 # the sampling window
    kill -0 "$publisher" 2>/dev/null || break # a window cut short: not printed
    t=$((t + 3))
    now=$(broker_ticks)
    awk -v t="$t" -v d="$((now - prev))" -v hz="$hz" 'BEGIN { printf "  %3d s: broker %.2f cores\n", t, d / hz / 3 }'
    prev=$now
  done
  wait "$publisher" || { cat "$work/loadgen.log"; exit 1; }
  grep '^published' "$work/loadgen.log" | sed 's/^/  /'
  if [ "$follow" = yes ]; then
    wait "$copier" || { cat "$work/copy.log"; exit 1; }
    grep '^passthrough' "$work/copy.log" | sed 's/^/  /'
  fi
}

echo "$engine broker, $rate records/s, publishing only:"
run_once no
scripts/broker.sh stop > /dev/null
scripts/broker.sh start "$engine" > /dev/null
echo "$engine broker, $rate records/s, a copy (consume, produce again) following the topic:"
run_once yes
