#!/usr/bin/env bash
# Installs what building and testing need on a fresh machine, skipping what
# is already there: libclang (bindgen for RocksDB), fastavro (the interop
# test's independent Avro implementation) and the local broker.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"

if ! dpkg -s libclang-dev >/dev/null 2>&1; then
  echo "Installing libclang-dev (bindgen needs it for RocksDB)..."
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev >/dev/null
fi

if [ "${1:-}" = "--tests" ] && ! python3 -c "import fastavro" >/dev/null 2>&1; then
  echo "Installing fastavro (interop tests)..."
  python3 -m pip install --quiet --disable-pip-version-check fastavro
fi

"$ROOT/scripts/broker.sh" install
