#!/usr/bin/env bash
# Runs every fuzz target briefly (CI smoke fuzzing). Usage: gateway/fuzz/run-short.sh [seconds]
#
# cargo-fuzz wants a nightly toolchain for `-Zsanitizer=address`; this machine has stable only,
# so RUSTC_BOOTSTRAP=1 lets the stable compiler accept the unstable flags. The same targets also
# run on plain stable in `cargo test` (aggregation_gateway::fuzzing's fixed-seed tests).
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_PER_TARGET="${1:-20}"
# The sanitizer build of the gateway takes minutes on a small machine: keep it outside the
# checkout so later runs on the same machine (CI clones afresh) only rebuild what changed.
TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/aggregation-gateway/fuzz-target}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
# Keep the fuzz lock file in step with the workspace's so the gateway builds with the same
# dependency versions it is tested with.
if [ ! -f Cargo.lock ]; then
  cp ../../Cargo.lock Cargo.lock
fi

mkdir -p "${TARGET_DIR}"
for target in $(cargo fuzz list); do
  echo "== fuzzing ${target} for ${SECONDS_PER_TARGET}s"
  mkdir -p "corpus/${target}"
  cargo fuzz run --target-dir "${TARGET_DIR}" "${target}" "corpus/${target}" -- \
    -max_total_time="${SECONDS_PER_TARGET}" -max_len=4096 -print_final_stats=1
done
echo "fuzzing: all targets ran without a finding"
