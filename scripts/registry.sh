#!/usr/bin/env bash
# A local schema registry for the integration tests: Apicurio Registry, from
# the distribution it publishes to Maven Central (scripts/registry/pom.xml),
# serving its Confluent-compatible REST API with in-memory storage. The
# reconciler and the tests talk to it only over that API.
#
#   scripts/registry.sh install   fetch and unpack it into the build cache if missing
#   scripts/registry.sh start     start it on 127.0.0.1:$REGISTRY_PORT (installs it first),
#                                 waiting until the API answers; says so if it already runs
#   scripts/registry.sh stop      stop it and wait for its exit (its schemas go with it)
#   scripts/registry.sh url       print the base URL of the Confluent-compatible API
#
# Apicurio Registry 3.x needs Java 21 or later: $REGISTRY_JAVA_HOME, then
# $JAVA_HOME, then `java` on PATH, then the newest JDK under /usr/lib/jvm,
# whichever is first new enough. Settings: $REGISTRY_PORT (default 18081),
# $REGISTRY_HEAP (default 256m), $REGISTRY_START_TIMEOUT (seconds, default 120),
# $REGISTRY_COMPATIBILITY (a global compatibility level such as BACKWARD,
# Confluent Schema Registry's default; unset, Apicurio has no global rule
# and accepts any new version until PUT /config sets a level).
# Its log is .run/registry-$REGISTRY_PORT.log.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN_DIR=${RECONCILER_RUN_DIR:-$ROOT/.run}
PORT=${REGISTRY_PORT:-18081}
PID_FILE=$RUN_DIR/registry-$PORT.pid
LOG=$RUN_DIR/registry-$PORT.log
URL=http://127.0.0.1:$PORT/apis/ccompat/v7

VERSION=$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' "$ROOT/scripts/registry/pom.xml")
CACHE=${RECONCILER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reconciler}
APP_DIR=$CACHE/apicurio-$VERSION

# The major version of the Java at `bin` (a java executable), or 0.
java_major() {
  "$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1 | grep . || echo 0
}

# Prints a java executable of version 21 or later, or fails saying why.
find_java() {
  local candidates=()
  [ -n "${REGISTRY_JAVA_HOME:-}" ] && candidates+=("$REGISTRY_JAVA_HOME/bin/java")
  [ -n "${JAVA_HOME:-}" ] && candidates+=("$JAVA_HOME/bin/java")
  command -v java >/dev/null 2>&1 && candidates+=("$(command -v java)")
  local dir
  for dir in $(ls -d /usr/lib/jvm/*/ 2>/dev/null | sort -rV); do
    candidates+=("${dir%/}/bin/java")
  done
  local java
  for java in "${candidates[@]}"; do
    if [ -x "$java" ] && [ "$(java_major "$java")" -ge 21 ]; then
      echo "$java"
      return 0
    fi
  done
  echo "Apicurio Registry $VERSION needs Java 21 or later; none found (REGISTRY_JAVA_HOME, JAVA_HOME, PATH, /usr/lib/jvm)" >&2
  return 1
}

have_registry() {
  [ -f "$APP_DIR/.complete" ]
}

# Copies the registry's distribution from Maven Central (via Maven, into
# its local repository too) and unpacks it into the build cache, once per
# version. It is unpacked beside the final directory and moved there whole,
# so that an interrupted install leaves nothing that looks complete.
install() {
  if have_registry; then
    [ "${1:-}" = quiet ] || echo "Apicurio Registry $VERSION already installed ($APP_DIR)"
    return
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "Installing Apicurio Registry needs Maven: no 'mvn' on PATH (Debian: apt-get install maven)" >&2
    return 1
  fi
  echo "Installing Apicurio Registry $VERSION from Maven Central (once; about 160 MB)..."
  mkdir -p "$CACHE"
  local tmp
  tmp=$(mktemp -d "$CACHE/apicurio-$VERSION.XXXXXX")
  local log="$tmp/maven.log"
  if ! mvn -B -q -f "$ROOT/scripts/registry/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$tmp/download" >"$log" 2>&1; then
    echo "Maven could not fetch Apicurio Registry $VERSION (scripts/registry/pom.xml); its last lines:" >&2
    grep -E 'ERROR|Could not' "$log" | head -10 >&2 || tail -20 "$log" >&2
    rm -rf "$tmp"
    return 1
  fi
  mkdir -p "$tmp/app"
  tar -xzf "$tmp/download/apicurio-registry-app-$VERSION-all.tar.gz" -C "$tmp/app"
  if [ ! -f "$tmp/app/quarkus-run.jar" ]; then
    echo "the Apicurio Registry $VERSION archive has no quarkus-run.jar; left in $tmp" >&2
    return 1
  fi
  touch "$tmp/app/.complete"
  rm -rf "$APP_DIR"
  mv "$tmp/app" "$APP_DIR"
  rm -rf "$tmp"
  echo "Apicurio Registry $VERSION installed: $(du -sh "$APP_DIR" | cut -f1) in $APP_DIR"
}

# True when the Confluent-compatible API answers 200 on $PORT.
answers() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$URL/subjects" 2>/dev/null)" = 200 ]
}

# The process id of the registry this script started on $PORT, if it still
# runs (a pid file whose process is gone, or is another program, is stale).
running_pid() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null && grep -qa quarkus-run.jar "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

start() {
  command -v curl >/dev/null 2>&1 || { echo "registry.sh needs curl (Debian: apt-get install curl)" >&2; exit 1; }
  local pid
  if pid=$(running_pid); then
    if wait_ready "$pid"; then
      echo "Apicurio Registry $VERSION already listening on $URL, pid $pid"
      return 0
    fi
    return 1
  fi
  rm -f "$PID_FILE"
  if answers; then
    echo "something else already answers on $URL (no registry of this script there); stop it or set REGISTRY_PORT" >&2
    return 1
  fi
  install quiet
  local java
  java=$(find_java)
  local rules=()
  [ -n "${REGISTRY_COMPATIBILITY:-}" ] && rules=(-Dapicurio.rules.global.compatibility="$REGISTRY_COMPATIBILITY")
  # In-memory storage is the default (an H2 database in memory, one per
  # start). The HTTP API listens on loopback only; the management interface
  # (health, metrics), which would take 0.0.0.0:9000, gets a free loopback
  # port of its own. Two database connections are plenty for tests (the
  # default keeps twenty). Only the first JIT tier: a test's few requests
  # never pay back the optimising compiler, and without it the registry
  # starts sooner and takes about 40 MB less memory.
  (cd "$APP_DIR" && exec "$java" -Xmx"${REGISTRY_HEAP:-256m}" -XX:TieredStopAtLevel=1 \
      -Djava.awt.headless=true \
      -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$PORT" \
      -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port=0 \
      -Dapicurio.datasource.jdbc.initial-size=2 -Dapicurio.datasource.jdbc.min-size=2 \
      "${rules[@]}" -jar quarkus-run.jar) >"$LOG" 2>&1 &
  pid=$!
  echo "$pid" > "$PID_FILE"
  if ! wait_ready "$pid"; then
    tail -30 "$LOG" >&2 || true
    # One that never answered is of no use: it does not stay behind.
    stop >/dev/null
    return 1
  fi
  echo "Apicurio Registry $VERSION listening on $URL, pid $pid"
}

# Until the API answers; fails at once if the process exits, or after
# $REGISTRY_START_TIMEOUT seconds.
wait_ready() {
  local pid=$1 deadline=$((SECONDS + ${REGISTRY_START_TIMEOUT:-120}))
  while [ "$SECONDS" -lt "$deadline" ]; do
    answers && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "Apicurio Registry exited before it answered on $URL; see $LOG" >&2
      rm -f "$PID_FILE"
      return 1
    fi
    sleep 0.1
  done
  echo "Apicurio Registry did not answer on $URL within ${REGISTRY_START_TIMEOUT:-120} s; see $LOG" >&2
  return 1
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$PID_FILE"
    echo "no Apicurio Registry running on port $PORT"
    return 0
  fi
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "Apicurio Registry (pid $pid) did not exit within 20 s of SIGTERM; killing it" >&2
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$PID_FILE"
  echo "Apicurio Registry stopped"
}

mkdir -p "$RUN_DIR"
case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  url) echo "$URL" ;;
  *) sed -n '/^set -euo pipefail/q;2,$p' "$0"; exit 2 ;;
esac
