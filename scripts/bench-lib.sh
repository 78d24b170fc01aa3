# Sourced by the benchmarks that run instances of the binary on a broker of
# their own (bench-restore.sh, bench-failover.sh, bench-idle.sh,
# bench-broker.sh), after `cd` to the root.
#
#   bench_start NAME ENGINE   builds the binary and runs a copy of it
#                             ($bin: a rebuild in another worktree during the
#                             run cannot change it), starts the broker on
#                             $BROKER_PORT, makes the scratch directory
#                             $work; on exit, stops what is left running,
#                             the broker, and removes $work
#   bench_kafka_toml PREFIX   the [security] and [kafka] tables of a config
#                             for that broker
#   bench_ready PORT          whether /readyz of the instance whose HTTP API is
#                             on 127.0.0.1:PORT answers 200 (every owned
#                             partition restored and caught up)
#   bench_lag PORT            the consumer lag, summed over partitions, of that
#                             instance (-1 before it reports any)

source scripts/env.sh

bench_start() {
  local name=$1 engine=$2
  local built
  built=$(scripts/build.sh)
  mkdir -p .run
  bin=$PWD/.run/reconciler-$name-bench
  cp "$built" "$bin"
  scripts/broker.sh start "$engine"
  work=$(mktemp -d)
  trap 'jobs -p | xargs -r kill 2>/dev/null; scripts/broker.sh stop; rm -rf "$work"' EXIT
}

bench_kafka_toml() {
  cat <<TOML
[security]
control_keys = ["bench-control-key-$1"]
[kafka]
"bootstrap.servers" = "127.0.0.1:$BROKER_PORT"
"receive.message.max.bytes" = "1000000000"
TOML
}

bench_ready() {
  curl -fs -o /dev/null "http://127.0.0.1:$1/readyz"
}

bench_lag() {
  curl -fs "http://127.0.0.1:$1/metrics" | awk '/^reconciler_consumer_lag\{/ { s += $2; n++ } END { print (n ? s : -1) }'
}
