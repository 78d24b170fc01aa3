# Sourced by the scripts. Cargo's intermediate artifacts (RocksDB,
# librdkafka, every crate) go to one build directory outside the clone,
# shared by every clone and kept between runs (CI on the same machine
# reuses it); the final artifacts (the binary the tests run) stay in the
# clone's own target/, so two clones never run each other's binary.
# Override with CARGO_BUILD_BUILD_DIR and CARGO_TARGET_DIR.
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_BUILD_BUILD_DIR=${CARGO_BUILD_BUILD_DIR:-$HOME/.cache/reconciler/target}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target}
