#!/usr/bin/env bash
# Runs every fuzz target briefly (CI smoke fuzzing). Usage: gateway/fuzz/run-short.sh [runs] [seed]
#
# A fixed number of runs from a fixed seed, starting from an empty corpus, so CI explores the
# same inputs on every machine: a finding is the code's (or an invariant's), never the clock's.
# For a longer local hunt: gateway/fuzz/run-short.sh 20000000 "$RANDOM".
#
# cargo-fuzz wants a nightly toolchain for `-Zsanitizer=address`; this machine has stable only,
# so RUSTC_BOOTSTRAP=1 lets the stable compiler accept the unstable flags. The same targets also
# run on plain stable in `cargo test` (aggregation_gateway::fuzzing's fixed-seed tests).
set -euo pipefail
cd "$(dirname "$0")"
RUNS_PER_TARGET="${1:-300000}"
SEED="${2:-1}"
# Keep the sanitizer build outside the checkout so later runs on the same machine (CI clones
# afresh) only rebuild what changed.
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
  echo "== fuzzing ${target}: ${RUNS_PER_TARGET} runs from seed ${SEED}"
  corpus="$(mktemp -d)"
  cargo fuzz run --target-dir "${TARGET_DIR}" "${target}" "${corpus}" -- \
    -seed="${SEED}" -runs="${RUNS_PER_TARGET}" -max_len=4096 -print_final_stats=1
  rm -rf "${corpus}"
done
echo "fuzzing: all targets ran without a finding"
