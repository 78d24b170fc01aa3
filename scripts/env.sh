# Sourced by the scripts: one shared build directory outside the clone, so
# repeated runs (and CI on the same machine) reuse the RocksDB and
# librdkafka builds. Override with CARGO_TARGET_DIR.
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/reconciler/target}
