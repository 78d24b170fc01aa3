#!/usr/bin/env bash
# Restore benchmark: how long a new instance (empty state
# directory) takes to be ready on partitions whose state another instance
# built, restoring from the changelog vs replaying the input, on the same
# broker and the same log, in one run.
#
#   scripts/bench-restore.sh                      # Apache Kafka (the changelog compacted), 1,000,000 operations
#   RESTORE_OPERATIONS=200000 scripts/bench-restore.sh noida
#
# Steps: loadgen publishes the workload; instance A processes it to the
# end and stops; instance B (changelog) and instance C (changelog = "",
# the input replay) each start on an empty state directory in the same
# group and are timed from start to /readyz answering 200 (every owned
# partition restored and caught up). B and C then stop without processing
# anything new, so both restore the same committed state.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
engine=${1:-kafka}
ops=${RESTORE_OPERATIONS:-1000000}
export BROKER_PORT=${BROKER_PORT:-19492}
# The log cleaner looks for work every second (Kafka's default: 15 s).
export BROKER_SETTINGS=${BROKER_SETTINGS:-log.cleaner.backoff.ms=1000}
bench_start restore "$engine"
prefix="restore-$$"
cat > "$work/reconciler.toml" <<EOF
state_dir = "$work/state-a"
[topics]
events = "$prefix.events"
verdicts = "$prefix.verdicts"
anomalies = "$prefix.anomalies"
dlq = "$prefix.dlq"
commands = "$prefix.commands"
changelog = "$prefix.state"
partitions = 6
[consumer]
group_id = "$prefix.group"
[http]
bind = "127.0.0.1:19493"
$(bench_kafka_toml "$prefix")
EOF
cfg="$work/reconciler.toml"
echo "machine: $(nproc) cores; broker: $engine; operations: $ops; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
compacting=0
if [ "$engine" = kafka ]; then
  # The changelog made for the log cleaner to compact what A writes: 16 MB
  # segments, cleaned once 1 % of a log is dirty (the broker looks every
  # second, BROKER_SETTINGS below). The input keeps every record.
  scripts/broker.sh topics --create --topic "$prefix.state" --partitions 6 --replication-factor 1 \
    --config cleanup.policy=compact --config segment.bytes=16777216 \
    --config min.cleanable.dirty.ratio=0.01 --config min.compaction.lag.ms=0 >/dev/null
  compacting=1
  dir=$(cut -d' ' -f2 ".run/broker-$BROKER_PORT.dir")
  mark=$(wc -l < "$dir/broker.log")
fi
"$bin" --config "$cfg" loadgen --operations "$ops" --truth "$work/truth.json" >/dev/null

# A: processes everything, then stops (its outputs acknowledged, offsets committed).
"$bin" --config "$cfg" run >"$work/a.log" 2>&1 &
pid=$!
start=$(date +%s.%N)
until bench_ready 19493 && [ "$(bench_lag 19493)" = 0 ]; do sleep 0.2; done # polling interval
echo "A processed the workload in $(echo "$(date +%s.%N) - $start" | bc) s"
kill -TERM $pid; wait $pid
if [ "$compacting" = 1 ]; then
  # Until the cleaner has had a pass over every changelog partition (the
  # active segment is never cleaned).
  t0=$(date +%s)
  for p in 0 1 2 3 4 5; do
    until tail -n +"$mark" "$dir/broker.log" | grep -q "cleaned log $prefix.state-$p "; do
      [ $(( $(date +%s) - t0 )) -lt 600 ] || { echo "the cleaner did not reach $prefix.state-$p within 600 s" >&2; break; }
      sleep 1 # polling interval
    done
  done
  echo "the log cleaner had passed over every changelog partition $(( $(date +%s) - t0 )) s after A's stop"
  written=$(scripts/broker.sh offsets --topic "$prefix.state" --time -1 2>/dev/null | awk -F: '{ s += $3 } END { print s }')
  echo "  changelog records written: $written"
fi

# Times an instance on an empty state directory from start to ready.
timed() {
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  env "$@" RECONCILER_STATE_DIR="$work/state-$name" "$bin" --config "$cfg" run >"$work/$name.log" 2>&1 &
  pid=$!
  until bench_ready 19493; do sleep 0.05; done # polling interval
  t1=$(date +%s.%N)
  kill -TERM $pid; wait $pid
  echo "$(echo "$t1 - $t0" | bc)"
}
b=$(timed b RECONCILER_LOG=info)
echo "B (changelog): ready after $b s; $(grep -c 'Partition restored from the changelog' "$work/b.log") partitions restored from the changelog"
sed 's/\x1b\[[0-9;]*m//g' "$work/b.log" | grep 'Partition restored from the changelog' \
  | sed -E 's/.*records=([0-9]+).*seconds=([0-9.]+).*/\1 \2/' \
  | awk '{ r += $1; s += $2 } END { printf "  changelog records read: %d in %.2f s of restore (%.0f records/s)\n", r, s, r / s }'
echo "  input records A applied: $(sed 's/\x1b\[[0-9;]*m//g' "$work/a.log" | grep -o 'Pipeline stopped records=[0-9]*' | grep -o '[0-9]*$')"
c=$(timed c RECONCILER_LOG=info RECONCILER_TOPICS__CHANGELOG=)
echo "C (input replay): ready after $c s; $(grep -c 'restoring its state from the log without publishing' "$work/c.log") partitions replayed from the input"
echo "restore from the changelog is $(echo "scale=1; $c / $b" | bc)x faster than from the input"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
