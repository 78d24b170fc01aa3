# Sourced by the scripts. Cargo's intermediate artifacts (RocksDB,
# librdkafka, every crate) go to one build directory outside the clone,
# shared by every clone and kept between runs (CI on the same machine
# reuses it); the final artifacts (the binary the tests run) stay in the
# clone's own target/, so two clones never run each other's binary.
# Override with CARGO_BUILD_BUILD_DIR and CARGO_TARGET_DIR.
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_BUILD_DIR=${CARGO_BUILD_BUILD_DIR:-$HOME/.cache/reconciler/target}
_clone=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$_clone/target}
# Cargo keys this crate's build units by package, not by path, and judges
# them fresh by modification times: after another clone built in the shared
# directory, a clone whose sources are older than that build would be handed
# the other clone's library, binary and tests without a sign (seen: a test
# compiled against another clone's `reconciler`). So the directory notes the
# clone whose scripts built there last, and another clone makes its sources
# newer than that build first (a fresh clone's are anyway).
if [ "$(cat "$CARGO_BUILD_BUILD_DIR/.last-clone" 2>/dev/null)" != "$_clone" ]; then
  touch "$_clone/src/lib.rs"
  mkdir -p "$CARGO_BUILD_BUILD_DIR"
  echo "$_clone" >"$CARGO_BUILD_BUILD_DIR/.last-clone"
fi
unset _clone
