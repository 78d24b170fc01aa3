#!/usr/bin/env bash
# Installs what building and testing need on a fresh machine, skipping what
# is already there: libclang (bindgen for RocksDB), fastavro (the interop
# test's independent Avro implementation), promtool, Chromium and the
# browser test's npm packages (with --tests) and the local broker.
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

# The HTTP tests: promtool (Debian's prometheus package) checks the alert
# rules; the panel's browser test drives Debian's Chromium through
# playwright-core (tests/browser, which downloads no browser of its own).
if [ "${1:-}" = "--tests" ]; then
  missing=()
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Installing ${missing[*]} (HTTP, alert-rule and browser tests)..."
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  lock="$ROOT/tests/browser/package-lock.json"
  stamp="$ROOT/tests/browser/node_modules/.package-lock.json"
  if [ ! -f "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
    echo "Installing the browser test's npm packages (npm ci)..."
    (cd "$ROOT/tests/browser" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

"$ROOT/scripts/broker.sh" install
