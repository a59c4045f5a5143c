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
# Runs per target: the request parsers take microseconds a run, the document targets build and
# walk whole specs and Tables (milliseconds a run under the sanitizer), so each has its own count,
# chosen to keep the step near a minute on CI's two cores. A count given here applies to all.
RUNS_PER_TARGET="${1:-}"
default_runs() {
  case "$1" in
    request_info | identity_headers) echo 100000 ;;
    openapi_v3_root) echo 20000 ;;
    openapi_v2 | openapi_v2_to_v3) echo 6000 ;;
    apiservice_table) echo 600 ;;
    *) echo 10000 ;;
  esac
}
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
  runs="${RUNS_PER_TARGET:-$(default_runs "${target}")}"
  echo "== fuzzing ${target}: ${runs} runs from seed ${SEED}"
  corpus="$(mktemp -d)"
  cargo fuzz run --target-dir "${TARGET_DIR}" "${target}" "${corpus}" -- \
    -seed="${SEED}" -runs="${runs}" -max_len=4096 -print_final_stats=1
  rm -rf "${corpus}"
  echo "== ${target}: ${SECONDS}s since the start"
done
echo "fuzzing: all targets ran without a finding"
