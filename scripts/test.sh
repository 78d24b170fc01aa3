#!/usr/bin/env bash
# The test command: installs what is missing, runs the offline tests (no
# broker, no other program), starts a local Apache Kafka and runs the
# integration tests (broker, schema registry, fastavro, confluent-kafka,
# promtool, Node.js, Chromium, OpenSSL, PostgreSQL), and stops the broker
# and the registry. Everything is built once, in release
# mode: RocksDB and librdkafka are too slow to build in two profiles.
#
# BROKER_ENGINE (scripts/broker.sh) runs the integration tests on another
# Kafka-protocol broker; Apache Kafka (kafka) is the default and the one
# every guarantee is shown on.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/env.sh
scripts/setup.sh --tests

# Style and lints first: they fail in seconds, the suite takes minutes.
cargo fmt --check
cargo clippy --release --locked --all-targets --all-features -- -D warnings
# The binary as the demo and the container image build it.
scripts/build.sh >/dev/null

# The build directory is shared with other clones (scripts/env.sh). Cargo
# judges a clone's test crates fresh by modification times, so after a
# newer build in another clone (CI's, at another path) they would keep that
# clone's paths (env!("CARGO_BIN_EXE_reconciler"), CARGO_MANIFEST_DIR) and
# fail to find their files. Touching their roots rebuilds them here (a fresh
# clone rebuilds them anyway).
touch tests/offline/main.rs tests/integration/main.rs

log=$(mktemp)
# --show-output: the fault-injection suites print their figures
# (iterations, crashes, inputs, losses, non-identical duplicates).
[ $# -gt 0 ] || set -- -- --show-output
set +e
cargo test --release --locked --no-fail-fast "$@" 2>&1 | tee "$log"
offline=${PIPESTATUS[0]}
set -e

export BROKER_PORT=${BROKER_PORT:-19092}
export BROKER_ENGINE=${BROKER_ENGINE:-kafka}
# The suites' settings of the test broker: a transaction left open past its
# timeout is aborted within a second of it, and the log cleaner looks for
# work every second (the compaction suite waits for it).
export BROKER_SETTINGS=${BROKER_SETTINGS:-transaction.abort.timed.out.transaction.cleanup.interval.ms=1000 log.cleaner.backoff.ms=1000}
integration=0
# The schema registry of the Confluent-framing tests (Apicurio Registry's
# Confluent-compatible API, in memory), with Confluent's default global
# compatibility level so that an incompatible schema is refused.
export REGISTRY_PORT=${REGISTRY_PORT:-18081}
export REGISTRY_COMPATIBILITY=${REGISTRY_COMPATIBILITY:-BACKWARD}
if scripts/registry.sh start; then
  export SCHEMA_REGISTRY_URL=$(scripts/registry.sh url)
else
  echo "The schema registry did not start (the reason is above): its tests will fail." | tee -a "$log"
fi
if scripts/broker.sh start "$BROKER_ENGINE"; then
  trap 'scripts/broker.sh stop; scripts/registry.sh stop' EXIT
  export KAFKA_BROKERS=127.0.0.1:$BROKER_PORT
  set +e
  cargo test --release --locked --no-fail-fast --features kafka-integration-tests --test integration "$@" 2>&1 | tee -a "$log"
  integration=${PIPESTATUS[0]}
  set -e
else
  echo "The integration tests did not run: the test broker ($BROKER_ENGINE) did not start (the reason is above)." | tee -a "$log"
  integration=1
fi
# One closing line for the whole suite, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "Tests: %d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
[ "$offline" -eq 0 ] && [ "$integration" -eq 0 ]
