#!/usr/bin/env bash
# The local Kafka brokers for development, tests, CI, benchmarks and the
# demo. The reconciler talks to them only over the Kafka protocol.
#
#   scripts/broker.sh install [kafka|noida|tansu]   install a broker if missing (default kafka)
#   scripts/broker.sh start [ENGINE] [KEY=VALUE...] start on 127.0.0.1:$BROKER_PORT in a fresh directory
#   scripts/broker.sh stop               stop the broker started by `start`, removing its data
#   scripts/broker.sh kill               kill -9 it, keeping its data (reliability tests)
#   scripts/broker.sh restart            start it again on the data a `kill` kept
#   scripts/broker.sh pid                print the running broker's process id (benchmarks read its CPU)
#   scripts/broker.sh acl ARGS...        Apache Kafka's kafka-acls (AclCommand) against the running
#                                        broker, as its super user on kafka-secure
#   scripts/broker.sh topics ARGS...     Apache Kafka's kafka-topics (TopicCommand), the same way
#   scripts/broker.sh offsets ARGS...    Apache Kafka's kafka-get-offsets (GetOffsetShell), the same way
#
# Engines:
#   kafka         Apache Kafka (the default): a single-node KRaft cluster,
#                 combined broker and controller, from the jars Maven
#                 Central publishes (scripts/kafka/pom.xml). Its data
#                 survives kill -9. KEY=VALUE arguments and $BROKER_SETTINGS
#                 (KEY=VALUE words) are broker settings for this start, e.g.
#                 transaction.max.timeout.ms=10000 log.cleaner.backoff.ms=100.
#   kafka-secure  the same with one SASL_SSL listener (SCRAM-SHA-256 over
#                 TLS) and the KRaft authorizer (StandardAuthorizer, nothing
#                 allowed without an ACL). TLS material comes from
#                 $BROKER_TLS_DIR: broker.p12 (PKCS12 key and certificate for
#                 127.0.0.1, password $BROKER_TLS_PASSWORD) and ca.pem (the
#                 certificate authority that signed it). SCRAM users:
#                 `admin` (a super user, password $BROKER_ADMIN_PASSWORD) and
#                 $BROKER_SCRAM_USER / $BROKER_SCRAM_PASSWORD.
#   noida         noida-db 0.2.3: a small Kafka-protocol broker in memory,
#                 quick to build; its data does not survive kill -9.
#   sqlite, memory, scram
#                 tansu 0.6.0 (sqlite or in-memory storage; scram: sqlite
#                 with SASL/SCRAM-SHA-256 enforced), another Kafka-protocol
#                 implementation.
#
# Apache Kafka needs Java 17 or later and Maven; its heap is bounded by
# $BROKER_HEAP (default 1g), and its controller listens on
# $BROKER_CONTROLLER_PORT (default $BROKER_PORT + 1000).
set -euo pipefail

TANSU_VERSION=0.6.0
NOIDA_VERSION=0.2.3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN_DIR=${RECONCILER_RUN_DIR:-$ROOT/.run}
PORT=${BROKER_PORT:-9092}
PID_FILE=$RUN_DIR/broker-$PORT.pid
DIR_FILE=$RUN_DIR/broker-$PORT.dir
export PATH="$HOME/.cargo/bin:$PATH"

KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$ROOT/scripts/kafka/pom.xml")
KAFKA_LIBS=${RECONCILER_CACHE:-$HOME/.cache/reconciler}/kafka-$KAFKA_VERSION/libs
CONTROLLER_PORT=${BROKER_CONTROLLER_PORT:-$((PORT + 1000))}

have_kafka() {
  [ -f "$KAFKA_LIBS/.complete" ]
}

# Copies Apache Kafka's broker and its dependencies from Maven Central into
# the build cache, once per version. Says exactly what is missing if it
# cannot.
install_kafka() {
  if have_kafka; then
    [ "${1:-}" = quiet ] || echo "Apache Kafka $KAFKA_VERSION already installed ($KAFKA_LIBS)"
    return
  fi
  if ! command -v java >/dev/null 2>&1; then
    echo "Apache Kafka needs Java 17 or later: no 'java' on PATH (Debian: apt-get install openjdk-17-jre-headless)" >&2
    return 1
  fi
  local major
  major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  if [ "${major:-0}" -lt 17 ]; then
    echo "Apache Kafka $KAFKA_VERSION needs Java 17 or later; 'java' is version ${major:-unknown}" >&2
    return 1
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "Installing Apache Kafka needs Maven: no 'mvn' on PATH (Debian: apt-get install maven)" >&2
    return 1
  fi
  echo "Installing Apache Kafka $KAFKA_VERSION from Maven Central (once; about 15 s and 55 MB)..."
  rm -rf "$KAFKA_LIBS"
  mkdir -p "$KAFKA_LIBS"
  local log="$KAFKA_LIBS/../maven.log"
  if ! mvn -B -q -f "$ROOT/scripts/kafka/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$KAFKA_LIBS" >"$log" 2>&1; then
    echo "Maven could not fetch Apache Kafka $KAFKA_VERSION (scripts/kafka/pom.xml); its last lines ($log):" >&2
    grep -E 'ERROR|Could not' "$log" | head -10 >&2 || tail -20 "$log" >&2
    return 1
  fi
  touch "$KAFKA_LIBS/.complete"
  echo "Apache Kafka $KAFKA_VERSION installed: $(du -sh "$KAFKA_LIBS" | cut -f1) in $KAFKA_LIBS"
}

# Replaces the calling (sub)shell with a JVM on Kafka's jars, logging to
# `dir`: call it in a subshell.
kafka_java() {
  local dir=$1; shift
  exec java -Xms"${BROKER_HEAP_MIN:-256m}" -Xmx"${BROKER_HEAP:-1g}" \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
    -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
    -Dkafka.logs.dir="$dir" -Dlog4j2.configurationFile="$ROOT/scripts/kafka/log4j2.properties" \
    -cp "$KAFKA_LIBS/*" "$@"
}

# Writes the server.properties of a single-node KRaft cluster in `dir`.
kafka_properties() {
  local engine=$1 dir=$2; shift 2
  local client=PLAINTEXT
  [ "$engine" = kafka-secure ] && client=SASL_SSL
  {
    echo "# A single-node Apache Kafka: broker and KRaft controller in one process."
    echo "process.roles=broker,controller"
    echo "node.id=1"
    echo "controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT"
    echo "listeners=$client://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT"
    echo "advertised.listeners=$client://127.0.0.1:$PORT"
    echo "controller.listener.names=CONTROLLER"
    echo "inter.broker.listener.name=$client"
    echo "listener.security.protocol.map=$client:$client,CONTROLLER:PLAINTEXT"
    echo "log.dirs=$dir/data"
    echo "# One replica of everything: there is one broker."
    echo "offsets.topic.replication.factor=1"
    echo "transaction.state.log.replication.factor=1"
    echo "transaction.state.log.min.isr=1"
    echo "share.coordinator.state.topic.replication.factor=1"
    echo "share.coordinator.state.topic.min.isr=1"
    echo "# A group's first member is not held back waiting for others."
    echo "group.initial.rebalance.delay.ms=0"
    if [ "$engine" = kafka-secure ]; then
      local tls=${BROKER_TLS_DIR:?BROKER_TLS_DIR: the directory of broker.p12 (kafka-secure)}
      echo "# SCRAM-SHA-256 over TLS for clients and the broker itself."
      echo "sasl.enabled.mechanisms=SCRAM-SHA-256"
      echo "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-256"
      echo "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"${BROKER_ADMIN_PASSWORD:-reconciler-admin-secret}\";"
      echo "ssl.keystore.type=PKCS12"
      echo "ssl.keystore.location=$tls/broker.p12"
      echo "ssl.keystore.password=${BROKER_TLS_PASSWORD:-reconciler-tls-secret}"
      echo "ssl.key.password=${BROKER_TLS_PASSWORD:-reconciler-tls-secret}"
      echo "# The broker is its own client between its listeners: it trusts the CA."
      echo "ssl.truststore.type=PEM"
      echo "ssl.truststore.location=$tls/ca.pem"
      echo "# The KRaft authorizer: what no ACL allows is refused. The controller"
      echo "# listener is plaintext on loopback, so its principal is ANONYMOUS."
      echo "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
      echo "allow.everyone.if.no.acl.found=false"
      echo "super.users=User:admin;User:ANONYMOUS"
    fi
    echo "# Settings of this start."
    # shellcheck disable=SC2086
    for kv in ${BROKER_SETTINGS:-} "$@"; do
      case "$kv" in
        *=*) echo "$kv" ;;
        *) echo "not a KEY=VALUE broker setting: $kv" >&2; return 1 ;;
      esac
    done
  } > "$dir/server.properties"
  # How Kafka's own tools connect, as the super user (`acl`).
  if [ "$engine" = kafka-secure ]; then
    {
      echo "security.protocol=SASL_SSL"
      echo "sasl.mechanism=SCRAM-SHA-256"
      echo "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"${BROKER_ADMIN_PASSWORD:-reconciler-admin-secret}\";"
      echo "ssl.truststore.type=PEM"
      echo "ssl.truststore.location=$BROKER_TLS_DIR/ca.pem"
    } > "$dir/admin.properties"
  else
    : > "$dir/admin.properties"
  fi
}

# Runs one of Apache Kafka's command-line tools (`class`, e.g.
# org.apache.kafka.tools.AclCommand) against the broker started on $PORT,
# as its super user on kafka-secure.
kafka_tool() {
  local class=$1; shift
  [ -f "$DIR_FILE" ] || { echo "no broker was started on port $PORT" >&2; exit 1; }
  local engine dir
  read -r engine dir < "$DIR_FILE"
  case "$engine" in kafka|kafka-secure) ;; *) echo "Apache Kafka's tools need Apache Kafka, not $engine" >&2; exit 2 ;; esac
  mkdir -p "$dir/tools"
  (kafka_java "$dir/tools" "$class" --bootstrap-server "127.0.0.1:$PORT" \
      --command-config "$dir/admin.properties" "$@")
}

# Formats `dir`'s storage (once: a directory kept from a killed broker is
# already formatted), then runs Apache Kafka there until it answers.
launch_kafka() {
  local engine=$1 dir=$2; shift 2
  install_kafka quiet
  if [ ! -f "$dir/data/meta.properties" ]; then
    kafka_properties "$engine" "$dir" "$@"
    local scram=()
    if [ "$engine" = kafka-secure ]; then
      scram=(--add-scram "SCRAM-SHA-256=[name=admin,password=${BROKER_ADMIN_PASSWORD:-reconciler-admin-secret}]"
             --add-scram "SCRAM-SHA-256=[name=${BROKER_SCRAM_USER:-reconciler},password=${BROKER_SCRAM_PASSWORD:-reconciler-scram-secret}]")
    fi
    # A cluster id of this directory's own (22 characters of base64url).
    # Given as --cluster-id=ID: an id that starts with "-" would read as an
    # option after a separate -t.
    local id
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | cut -c1-22)
    if ! (kafka_java "$dir" kafka.tools.StorageTool format --cluster-id="$id" -c "$dir/server.properties" \
        "${scram[@]}") >"$dir/format.log" 2>&1; then
      echo "formatting Apache Kafka's storage failed ($dir/format.log):" >&2
      tail -20 "$dir/format.log" >&2
      return 1
    fi
  fi
  (kafka_java "$dir" kafka.Kafka "$dir/server.properties" >"$dir/broker.out" 2>&1) &
  echo $! > "$PID_FILE"
  if ! wait_kafka "$engine" "$dir"; then
    tail -30 "$dir/broker.out" >&2 || true
    grep -E 'ERROR|FATAL' "$dir/broker.log" 2>/dev/null | tail -10 >&2 || true
    return 1
  fi
  echo "Apache Kafka $KAFKA_VERSION ($engine) listening on 127.0.0.1:$PORT, pid $(cat "$PID_FILE"), data in $dir"
}

# Until the broker answers a metadata request (kafka), or says it started
# and opens its port (kafka-secure, whose only listener needs SASL over
# TLS); fails at once if the process exits.
wait_kafka() {
  local engine=$1 dir=$2
  for _ in $(seq 1 600); do
    if [ "$engine" = kafka-secure ]; then
      if grep -q 'Kafka Server started' "$dir/broker.log" 2>/dev/null &&
          (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        return 0
      fi
    elif python3 "$ROOT/scripts/kafka/ready.py" 127.0.0.1 "$PORT" 1 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
      echo "Apache Kafka exited before it was ready; see $dir/broker.log and $dir/broker.out" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "Apache Kafka did not answer on 127.0.0.1:$PORT within 60 s; see $dir/broker.log" >&2
  return 1
}

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
  local engine=${1:-kafka}
  [ $# -gt 0 ] && shift
  case "$engine" in
    kafka|kafka-secure) ;; # launch_kafka installs it
    noida) install_noida ;;
    *) install ;;
  esac
  stop >/dev/null 2>&1 || true
  local dir
  dir="$RUN_DIR/broker-$PORT-$(date +%s%N)"
  mkdir -p "$dir"
  launch "$engine" "$dir" "$@"
}

# Runs tansu with `engine` in `dir` (fresh or kept from a killed broker).
launch() {
  local engine=$1 dir=$2; shift 2
  echo "$engine $dir" > "$DIR_FILE"
  case "$engine" in
    kafka|kafka-secure) launch_kafka "$engine" "$dir" "$@"; return ;;
  esac
  [ $# -eq 0 ] || { echo "broker settings are for Apache Kafka only, not $engine: $*" >&2; exit 2; }
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
    *) echo "unknown engine $engine (kafka|kafka-secure|noida|sqlite|memory|scram)" >&2; exit 2 ;;
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
    echo "sqlite3 not found: tansu runs without the header index and slows down as headers accumulate (apt-get install sqlite3)" >&2
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
  install)
    case "${2:-kafka}" in
      kafka) install_kafka ;;
      noida) install_noida ;;
      tansu) install ;;
      *) echo "unknown broker ${2} (kafka|noida|tansu)" >&2; exit 2 ;;
    esac ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  kill) kill9 ;;
  restart) restart ;;
  acl) shift; kafka_tool org.apache.kafka.tools.AclCommand "$@" ;;
  topics) shift; kafka_tool org.apache.kafka.tools.TopicCommand "$@" ;;
  offsets) shift; kafka_tool org.apache.kafka.tools.GetOffsetShell "$@" ;;
  pid) [ -f "$PID_FILE" ] || { echo "no broker is running on port $PORT" >&2; exit 1; }; cat "$PID_FILE" ;;
  *) sed -n '/^set -euo pipefail/q;2,$p' "$0"; exit 2 ;;
esac
