#!/usr/bin/env bash
# Failover benchmark: two instances A and S share the
# partitions of a workload; A stops; how long until S owns every partition
# and is ready (/readyz: all owned partitions restored and caught up). In
# one run, on the same broker, three ways S can get A's partitions:
#
#   standby    [consumer] standby_replicas = 1: S tails A's changelog and
#              catches up from where its standby was
#   changelog  no standby: S restores A's partitions from the changelog
#   input      no changelog: S replays the input of A's partitions
#
#   scripts/bench-failover.sh                      # Apache Kafka, 300,000 operations
#   FAILOVER_OPERATIONS=1000000 scripts/bench-failover.sh noida
#
# Each way gets its own topics and the same loadgen workload; A and S
# process it together to the end before A stops (SIGTERM: a clean leave,
# so the group rebalances at once and the time is the takeover's own).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
engine=${1:-kafka}
ops=${FAILOVER_OPERATIONS:-300000}
export BROKER_PORT=${BROKER_PORT:-19592}
bench_start failover "$engine"
echo "machine: $(nproc) cores; broker: $engine; operations: $ops; load before: $(cut -d' ' -f1-3 /proc/loadavg)"

readyz() { curl -fs "http://127.0.0.1:$1/readyz" 2>/dev/null || true; }
# Ready on all 6 partitions.
all_ready() { readyz "$1" | grep -q '"ready":true,"assigned":true,"partitions":6,'; }
metric() { curl -fs "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m { print $2 }'; }

for way in standby changelog input; do
  prefix="failover-$way-$$"
  changelog="$prefix.state"
  standby=0
  case $way in
    standby) standby=1 ;;
    input) changelog="" ;;
  esac
  cfg="$work/$way.toml"
  cat > "$cfg" <<EOF
[topics]
events = "$prefix.events"
verdicts = "$prefix.verdicts"
anomalies = "$prefix.anomalies"
dlq = "$prefix.dlq"
commands = "$prefix.commands"
changelog = "$changelog"
fleet = "$prefix.fleet"
partitions = 6
[consumer]
group_id = "$prefix.group"
standby_replicas = $standby
$(bench_kafka_toml "$prefix")
EOF
  "$bin" --config "$cfg" loadgen --operations "$ops" --truth "$work/$way-truth.json" >/dev/null
  RECONCILER_LOG=info RECONCILER_STATE_DIR="$work/$way-a" RECONCILER_HTTP__BIND=127.0.0.1:19593 \
    "$bin" --config "$cfg" run >"$work/$way-a.log" 2>&1 &
  a=$!
  RECONCILER_LOG=info RECONCILER_STATE_DIR="$work/$way-s" RECONCILER_HTTP__BIND=127.0.0.1:19594 \
    "$bin" --config "$cfg" run >"$work/$way-s.log" 2>&1 &
  s=$!
  # Both members hold partitions, and everything is processed.
  until readyz 19593 | grep -q '"ready":true' && readyz 19594 | grep -q '"ready":true' \
    && [ "$(bench_lag 19593)" = 0 ] && [ "$(bench_lag 19594)" = 0 ] && ! all_ready 19594; do sleep 0.2; done # polling interval
  if [ "$way" = standby ]; then
    # S's standby of A's partitions has caught up with their changelog.
    until [ "$(metric 19594 reconciler_standby_partitions)" -gt 0 ] && [ "$(metric 19594 reconciler_standby_lag_records)" = 0 ]; do sleep 0.2; done # polling interval
  fi
  t0=$(date +%s.%N)
  kill -TERM $a
  until all_ready 19594; do sleep 0.02; done # polling interval
  t1=$(date +%s.%N)
  wait $a
  kill -TERM $s; wait $s
  took=$(echo "$t1 - $t0" | bc)
  eval "took_$way=$took"
  clean() { sed 's/\x1b\[[0-9;]*m//g' "$work/$way-s.log"; }
  echo "$way: S ready on all 6 partitions $took s after A was told to stop;" \
    "standby takeovers $(clean | grep -c 'taken over from its standby replica here' || true)," \
    "changelog restores $(clean | grep -c 'Partition restored from the changelog' || true)," \
    "input replays $(clean | grep -c 'restoring its state from the log without publishing' || true)"
done
echo "failover with a standby is $(echo "scale=1; $took_changelog / $took_standby" | bc)x faster than a changelog restore and $(echo "scale=1; $took_input / $took_standby" | bc)x faster than an input replay"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
