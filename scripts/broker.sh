#!/usr/bin/env bash
# The local Kafka-protocol brokers for development, tests, CI and the
# demo. The reconciler talks to them only over the Kafka protocol; on a real
# deployment this is Apache Kafka (see docker-compose.yml).
#
#   scripts/broker.sh install [noida]    install tansu 0.6.0 (or noida-db 0.2.3) if missing
#   scripts/broker.sh start [sqlite|memory|noida|scram]   start on 127.0.0.1:$BROKER_PORT in a fresh directory
#   scripts/broker.sh stop               stop the broker started by `start`, removing its data
#   scripts/broker.sh kill               kill -9 it, keeping its data (reliability tests)
#   scripts/broker.sh restart            start it again on the data a `kill` kept
#   scripts/broker.sh pid                print the running broker's process id (benchmarks read its CPU)
#
# tansu sqlite (default) survives broker kill -9; tansu memory is ~10x
# faster but is only right for throughput runs from offset 0. noida
# (noida-db) has Kafka transactions (the exactly_once suites) and is fast,
# but keeps its data in memory: it does not survive a kill -9. scram is tansu
# sqlite with SASL/SCRAM-SHA-256 enforced, one user $BROKER_SCRAM_USER /
# $BROKER_SCRAM_PASSWORD (the broker-authentication test; neither broker
# has working TLS, see RELIABILITY.md).
set -euo pipefail

TANSU_VERSION=0.6.0
NOIDA_VERSION=0.2.3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN_DIR=${RECONCILER_RUN_DIR:-$ROOT/.run}
PORT=${BROKER_PORT:-9092}
PID_FILE=$RUN_DIR/broker-$PORT.pid
DIR_FILE=$RUN_DIR/broker-$PORT.dir
export PATH="$HOME/.cargo/bin:$PATH"

have_tansu() {
  command -v tansu >/dev/null 2>&1 && tansu --version 2>/dev/null | grep -q "$TANSU_VERSION"
}

install() {
  if have_tansu; then
    echo "tansu $TANSU_VERSION already installed"
    return
  fi
  echo "Installing tansu $TANSU_VERSION (once; about 11 minutes on 2 cores)..."
  # The default features have no storage engine: dynostore (memory) and
  # libsql (sqlite) are needed.
  cargo install tansu --locked --version "$TANSU_VERSION" --features dynostore,libsql
}

have_noida() {
  command -v noida-db >/dev/null 2>&1 && noida-db version 2>/dev/null | grep -q "$NOIDA_VERSION"
}

install_noida() {
  if have_noida; then
    echo "noida-db $NOIDA_VERSION already installed"
    return
  fi
  echo "Installing noida-db $NOIDA_VERSION (once; about 1 minute on 2 cores)..."
  # Only its Kafka service: a small binary, a short build.
  cargo install noida-db --version "$NOIDA_VERSION" --locked --no-default-features --features kafka
}

wait_port() {
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      return 0
    fi
    if [ -f "$PID_FILE" ] && ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
      echo "broker exited; see $1/broker.log" >&2
      tail -20 "$1/broker.log" >&2 || true
      return 1
    fi
    sleep 0.1
  done
  echo "broker did not open 127.0.0.1:$PORT within 30 s" >&2
  return 1
}

start() {
  local engine=${1:-sqlite}
  if [ "$engine" = noida ]; then install_noida; else install; fi
  stop >/dev/null 2>&1 || true
  local dir
  dir="$RUN_DIR/broker-$PORT-$(date +%s%N)"
  mkdir -p "$dir"
  launch "$engine" "$dir"
}

# Runs tansu with `engine` in `dir` (fresh or kept from a killed broker).
launch() {
  local engine=$1 dir=$2
  echo "$engine $dir" > "$DIR_FILE"
  local url
  local auth=()
  case "$engine" in
    sqlite) url="sqlite://tansu.db" ;;
    scram)
      url="sqlite://tansu.db"
      auth=(--authentication)
      if [ ! -f "$dir/.scram-user" ]; then
        # tansu's `user create` cannot log in, so the user is made on a
        # first start without authentication, on the same database.
        (cd "$dir" && : > .env && exec tansu broker --listener-url "tcp://127.0.0.1:$PORT" \
            --advertised-listener-url "tcp://127.0.0.1:$PORT" --storage-engine "$url" >broker.log 2>&1) &
        echo $! > "$PID_FILE"
        wait_port "$dir"
        tansu user create --broker "tcp://127.0.0.1:$PORT" --mechanism scram256 \
          "${BROKER_SCRAM_USER:-reconciler}" "${BROKER_SCRAM_PASSWORD:-reconciler-scram-secret}"
        stop_process >/dev/null
        touch "$dir/.scram-user"
        echo "$engine $dir" > "$DIR_FILE"
      fi ;;
    memory) url="memory://tansu/" ;;
    noida)
      # Kafka only; the data directory holds what a clean stop saves.
      (cd "$dir" && exec noida-db start --only kafka --host 127.0.0.1 --kafka-port "$PORT" \
          --data-dir "$dir/noida" >broker.log 2>&1) &
      echo $! > "$PID_FILE"
      wait_port "$dir"
      echo "noida-db listening on 127.0.0.1:$PORT, pid $(cat "$PID_FILE"), data in $dir"
      return ;;
    *) echo "unknown engine $engine (sqlite|memory|noida|scram)" >&2; exit 2 ;;
  esac
  # tansu reads a .env in its working directory and resolves sqlite paths
  # relative to it: run it inside the fresh directory.
  (cd "$dir" && : > .env && exec tansu broker \
      --listener-url "tcp://127.0.0.1:$PORT" \
      --advertised-listener-url "tcp://127.0.0.1:$PORT" \
      --storage-engine "$url" "${auth[@]}" >broker.log 2>&1) &
  echo $! > "$PID_FILE"
  wait_port "$dir"
  if [ "$url" = "sqlite://tansu.db" ]; then index_headers "$dir/tansu.db"; fi
  echo "tansu ($engine) listening on 127.0.0.1:$PORT, pid $(cat "$PID_FILE"), data in $dir"
}

# tansu 0.6.0's sqlite schema has no index on the record headers, and its
# fetch looks a record's headers up with a scan of every header stored
# (`header_fetch.sql`): each record fetched costs a pass over all the
# headers the broker holds, so fetches slow down as records with headers
# accumulate, until a long test suite's later tests time out (a kill -9
# test on a broker that had taken ~19k headers: 49, 80, 141 s, then four
# failures on fetch and metadata timeouts; with this index 32 s). An index
# changes no answer, only how fast the broker finds it. Made once tansu
# has created its tables, through sqlite's own locking.
index_headers() {
  local db=$1
  if ! command -v sqlite3 >/dev/null 2>&1; then
    echo "sqlite3 not found: tansu runs without the header index and slows down as headers accumulate (scripts/setup.sh --tests installs it)" >&2
    return 0
  fi
  for _ in $(seq 1 100); do
    if sqlite3 -cmd ".timeout 5000" "$db" \
        "create index if not exists header_topition_offset on header (topition, offset_id)" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "could not index the headers of $db" >&2
  return 1
}

kill9() {
  if [ -f "$PID_FILE" ]; then
    local pid
    pid=$(cat "$PID_FILE")
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$PID_FILE"
    echo "broker killed (data kept)"
  fi
}

restart() {
  [ -f "$DIR_FILE" ] || { echo "no broker was started on port $PORT" >&2; exit 1; }
  local engine dir
  read -r engine dir < "$DIR_FILE"
  kill9 >/dev/null
  launch "$engine" "$dir"
}

# Stops the broker process, keeping its data.
stop_process() {
  if [ -f "$PID_FILE" ]; then
    local pid
    pid=$(cat "$PID_FILE")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE"
    echo "broker stopped"
  fi
}

stop() {
  stop_process
  # Its data goes too: the next `start` takes a fresh directory, and only
  # `kill` + `restart` reuse one. (Kept, they filled .run with a directory
  # per test run: 476 of them, 3.1 GB, on one development machine.)
  if [ -f "$DIR_FILE" ]; then
    local engine dir
    read -r engine dir < "$DIR_FILE"
    case "$dir" in
      "$RUN_DIR"/broker-"$PORT"-*) rm -rf "$dir" ;;
    esac
    rm -f "$DIR_FILE"
  fi
}

mkdir -p "$RUN_DIR"
case "${1:-}" in
  install) if [ "${2:-}" = noida ]; then install_noida; else install; fi ;;
  start) start "${2:-sqlite}" ;;
  stop) stop ;;
  kill) kill9 ;;
  restart) restart ;;
  pid) [ -f "$PID_FILE" ] || { echo "no broker is running on port $PORT" >&2; exit 1; }; cat "$PID_FILE" ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
