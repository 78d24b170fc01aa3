#!/usr/bin/env bash
# The local Kafka-protocol broker (tansu) for development, tests, CI and the
# demo. The reconciler talks to it only over the Kafka protocol; on a real
# deployment this is Apache Kafka (see docker-compose.yml).
#
#   scripts/broker.sh install            install tansu 0.6.0 from crates.io if missing
#   scripts/broker.sh start [sqlite|memory]   start on 127.0.0.1:$BROKER_PORT in a fresh directory
#   scripts/broker.sh stop               stop the broker started by `start`
#   scripts/broker.sh kill               kill -9 it, keeping its data (reliability tests)
#   scripts/broker.sh restart            start it again on the data of the last `start`
#
# sqlite (default) survives broker restarts; memory is ~10x faster but is
# only right for throughput runs from offset 0.
set -euo pipefail

TANSU_VERSION=0.6.0
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
  echo "Installing tansu $TANSU_VERSION (once; about 15 minutes)..."
  # The default features have no storage engine: dynostore (memory) and
  # libsql (sqlite) are needed.
  cargo install tansu --locked --version "$TANSU_VERSION" --features dynostore,libsql
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
  install
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
  case "$engine" in
    sqlite) url="sqlite://tansu.db" ;;
    memory) url="memory://tansu/" ;;
    *) echo "unknown engine $engine (sqlite|memory)" >&2; exit 2 ;;
  esac
  # tansu reads a .env in its working directory and resolves sqlite paths
  # relative to it: run it inside the fresh directory.
  (cd "$dir" && : > .env && exec tansu broker \
      --listener-url "tcp://127.0.0.1:$PORT" \
      --advertised-listener-url "tcp://127.0.0.1:$PORT" \
      --storage-engine "$url" >broker.log 2>&1) &
  echo $! > "$PID_FILE"
  wait_port "$dir"
  echo "tansu ($engine) listening on 127.0.0.1:$PORT, pid $(cat "$PID_FILE"), data in $dir"
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

stop() {
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

mkdir -p "$RUN_DIR"
case "${1:-}" in
  install) install ;;
  start) start "${2:-sqlite}" ;;
  stop) stop ;;
  kill) kill9 ;;
  restart) restart ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
