#!/usr/bin/env bash
# The probed loadgen workload through `reconciler run` with the probe worker
# enabled, against the loadgen destination, then `loadgen verify`
# (BENCHMARKS.md, "The probe worker"). Needs a broker on $KAFKA_BROKERS and
# the release binary (cargo build --release).
#
#   KAFKA_BROKERS=127.0.0.1:9092 OPS=50000 RATE=2000 CONFIRM=30000 scripts/loadgen-probed.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${KAFKA_BROKERS:-127.0.0.1:9092}
BIN=${BIN:-$ROOT/target/release/reconciler}
P=probed-$(date +%s); D=$(mktemp -d); DEST_PORT=${DEST_PORT:-19467}; HTTP_PORT=${HTTP_PORT:-19464}
cat > "$D/r.toml" <<EOF
state_dir = "$D/state"
[topics]
events = "$P.events"
verdicts = "$P.verdicts"
anomalies = "$P.anomalies"
dlq = "$P.dlq"
commands = "$P.commands"
partitions = 6
[consumer]
group_id = "$P.group"
[probe]
enabled = true
group_id = "$P.probe"
state_dir = "$D/probe"
[http]
bind = "127.0.0.1:$HTTP_PORT"
[destinations.records]
kind = "http"
url = "http://127.0.0.1:$DEST_PORT/effects/{idempotency_key}"
remote_id_pointer = "/id"
version_pointer = "/version"
[security]
control_keys = ["loadgen-probed-control-key"]
[kafka]
"bootstrap.servers" = "$B"
EOF
"$BIN" --config "$D/r.toml" loadgen --operations "${OPS:-50000}" --probed 0.1 --event-time now \
  --rate "${RATE:-2000}" --confirm-within-ms "${CONFIRM:-30000}" --truth "$D/t.json" --quiet &
LG=$!
# The truth is written before publishing; the destination serves it.
until [ -s "$D/t.json" ]; do kill -0 $LG 2>/dev/null || exit 1; sleep 0.2; done
"$BIN" loadgen destination --truth "$D/t.json" --bind "127.0.0.1:$DEST_PORT" >/dev/null &
DEST=$!
RECONCILER_LOG=error "$BIN" --config "$D/r.toml" run &
RUN=$!
trap 'kill $RUN $DEST 2>/dev/null; wait $RUN 2>/dev/null; rm -rf "$D"' EXIT
wait $LG
"$BIN" --config "$D/r.toml" loadgen verify --truth "$D/t.json" --state-dir "$D/state" --timeout-secs 600
status=$?
curl -s "127.0.0.1:$HTTP_PORT/metrics" | grep -E '^reconciler_probes_total\{destination="records"'
exit $status
