#!/usr/bin/env bash
# Installs what building and testing need on a fresh machine, skipping what
# is already there.
#
#   scripts/setup.sh           build packages and the local broker (Apache Kafka)
#   scripts/setup.sh --tests   the same plus what the test suite needs
#   scripts/setup.sh --build   build packages only (the Dockerfile's builder, the demo)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
mode=${1:-}

# Debian packages the release build needs: libclang (bindgen for RocksDB),
# a C++ compiler and make (RocksDB, librdkafka), OpenSSL and zlib headers
# (librdkafka's TLS and compression).
BUILD_PACKAGES="libclang-dev g++ make pkg-config libssl-dev zlib1g-dev"

# Installs the Debian packages of "$@" that are missing.
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "Installing ${missing[*]}..."
  local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

apt_install $BUILD_PACKAGES
[ "$mode" = "--build" ] && exit 0

if [ "$mode" = "--tests" ]; then
  # fastavro: the interop test's independent Avro implementation.
  if ! python3 -c "import fastavro" >/dev/null 2>&1; then
    echo "Installing fastavro (interop tests)..."
    # A Python that the system manages (Debian's own, PEP 668) refuses pip
    # installs; then fastavro goes to the user's site-packages only.
    python3 -m pip install --quiet --disable-pip-version-check fastavro 2>/dev/null ||
      python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages fastavro
  fi
  # confluent-kafka: the registry interop test's independent client.
  if ! python3 -c "import confluent_kafka.schema_registry.avro" >/dev/null 2>&1; then
    echo "Installing confluent-kafka (registry interop tests)..."
    python3 -m pip install --quiet --disable-pip-version-check 'confluent-kafka[avro,schemaregistry]' 2>/dev/null ||
      python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages 'confluent-kafka[avro,schemaregistry]'
  fi
  # promtool (Debian's prometheus package) checks the alert rules; the
  # panel's browser test drives Debian's Chromium through playwright-core;
  # Node.js also reads the deployment files' YAML (tests/integration/deploy.rs).
  missing=()
  # PostgreSQL: the probe worker's postgres destination is tested against a
  # throw-away cluster (initdb, pg_ctl) the tests start on a private port.
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  # openssl: the TLS suite makes its certificate authority and the
  # broker's certificate.
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
  # npm packages: the browser test's playwright-core (it downloads no
  # browser of its own), and the deployment checks' YAML parser and the
  # Compose specification's JSON schema. Reinstalled when a lock file
  # is newer than what is installed.
  for dir in tests/browser tests/deploy; do
    lock="$ROOT/$dir/package-lock.json"
    stamp="$ROOT/$dir/node_modules/.package-lock.json"
    if [ ! -f "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
      echo "Installing the npm packages of $dir (npm ci)..."
      (cd "$ROOT/$dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
    fi
  done
fi

# Apache Kafka, the local broker of the demo and the tests: its jars from
# Maven Central, once (about 15 s). It runs on Java 17 or later; Debian's
# JRE and Maven are installed where missing.
command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
command -v mvn >/dev/null 2>&1 || apt_install maven
"$ROOT/scripts/broker.sh" install kafka
