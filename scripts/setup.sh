#!/usr/bin/env bash
# Installs what building and testing need on a fresh machine, skipping what
# is already there.
#
#   scripts/setup.sh           build packages and the local broker (demo)
#   scripts/setup.sh --tests   the same plus what the test suite needs
#   scripts/setup.sh --build   build packages only (the Dockerfile's builder)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
mode=${1:-}

# Debian packages the release build needs: libclang (bindgen for RocksDB),
# a C++ compiler and make (RocksDB, librdkafka), OpenSSL and zlib headers
# (librdkafka's TLS and compression).
BUILD_PACKAGES="libclang-dev g++ make pkg-config libssl-dev zlib1g-dev"

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

if [ "$mode" = "--tests" ] && ! python3 -c "import fastavro" >/dev/null 2>&1; then
  echo "Installing fastavro (interop tests)..."
  python3 -m pip install --quiet --disable-pip-version-check fastavro
fi

# Node.js packages of the deployment checks (tests/deploy.rs): a YAML
# parser and the Compose specification's JSON schema.
# (npm ci takes a second and keeps node_modules equal to the lock file.)
if [ "$mode" = "--tests" ]; then
  (cd "$ROOT/tests/deploy" && npm ci --no-audit --no-fund --loglevel=error)
fi

"$ROOT/scripts/broker.sh" install
