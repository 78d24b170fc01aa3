#!/usr/bin/env bash
# Restore benchmark (issue 17): how long a new instance (empty state
# directory) takes to be ready on partitions whose state another instance
# built, restoring from the changelog vs replaying the input, on the same
# broker and the same log, in one run.
#
#   scripts/bench-restore.sh                      # Apache Kafka, 1,000,000 operations
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
"$bin" --config "$cfg" loadgen --operations "$ops" --truth "$work/truth.json" >/dev/null

# A: processes everything, then stops (its outputs acknowledged, offsets committed).
"$bin" --config "$cfg" run >"$work/a.log" 2>&1 &
pid=$!
start=$(date +%s.%N)
until bench_ready 19493 && [ "$(bench_lag 19493)" = 0 ]; do sleep 0.2; done # polling interval
echo "A processed the workload in $(echo "$(date +%s.%N) - $start" | bc) s"
kill -TERM $pid; wait $pid

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
