#!/usr/bin/env bash
# Idle cost: the CPU an idle `reconciler run` takes once it has caught up
# on its input, by thread, as a share of one core.
#
#   scripts/bench-idle.sh                     # Apache Kafka, 30 s
#   IDLE_SECS=60 scripts/bench-idle.sh noida
#   IDLE_BIN=/tmp/reconciler-old scripts/bench-idle.sh   # another binary
#
# Steps: loadgen publishes 200 operations; the pipeline consumes them
# until /readyz answers and its consumer lag is 0; then its threads' CPU
# ticks (/proc/PID/task/*/stat) are read at the start and the end of
# IDLE_SECS seconds in which nothing is published.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
engine=${1:-kafka}
secs=${IDLE_SECS:-30}
export BROKER_PORT=${BROKER_PORT:-19592}
bench_start idle "$engine"
[ -n "${IDLE_BIN:-}" ] && bin=$IDLE_BIN
port=$((BROKER_PORT + 1))
http=127.0.0.1:$port
{
  echo "state_dir = \"$work/state\""
  printf '[http]\nbind = "%s"\n' "$http"
  bench_kafka_toml idle
} > "$work/reconciler.toml"

"$bin" loadgen --config "$work/reconciler.toml" --operations 200 --quiet
"$bin" run --config "$work/reconciler.toml" > "$work/run.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  if bench_ready "$port" && [ "$(bench_lag "$port")" = 0 ]; then break; fi
  kill -0 "$pid" 2>/dev/null || { cat "$work/run.log"; exit 1; }
  sleep 0.1
done
bench_ready "$port" && [ "$(bench_lag "$port")" = 0 ] || { echo "the pipeline did not catch up"; tail -20 "$work/run.log"; exit 1; }

ticks() { for t in /proc/"$pid"/task/*; do echo "$(cat "$t/comm")|$(awk '{print $14 + $15}' "$t/stat")|${t##*/}"; done | sort -t'|' -k3; }
ticks > "$work/before"
sleep "$secs" # the measured window: nothing is published meanwhile
ticks > "$work/after"
hz=$(getconf CLK_TCK)
echo "idle reconciler run ($engine broker, ${secs} s): % of one core by thread"
join -t'|' -j3 "$work/before" "$work/after" |
  awk -F'|' -v s="$secs" -v hz="$hz" '{ d = ($5 - $3) / hz; t += d; if (d > 0) printf "  %-16s %5.2f %%\n", $2, 100 * d / s }
    END { printf "  whole process    %5.2f %%\n", 100 * t / s }'
kill -INT "$pid"
wait "$pid" || true
