#!/usr/bin/env bash
# Runs every fuzz target briefly (CI smoke fuzzing). Usage: gateway/fuzz/run-short.sh [runs] [seed]
#
# A fixed number of runs from a fixed seed, starting from an empty corpus, so CI explores the
# same inputs on every machine: a finding is the code's (or an invariant's), never the clock's.
# For a longer local hunt: gateway/fuzz/run-short.sh 20000000 "$RANDOM".
#
# `-Zsanitizer=address` wants a nightly toolchain; this machine has stable only, so
# RUSTC_BOOTSTRAP=1 lets the stable compiler accept the unstable flags. The same targets also
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

export RUSTC_BOOTSTRAP=1
# Keep the fuzz lock file in step with the workspace's so the gateway builds with the same
# dependency versions it is tested with.
if [ ! -f Cargo.lock ]; then
  cp ../../Cargo.lock Cargo.lock
fi

# The build cargo-fuzz would make (`cargo fuzz build`: libFuzzer's coverage instrumentation,
# AddressSanitizer, debug assertions, for the host target so build scripts stay uninstrumented),
# without installing cargo-fuzz, which is most of this step's time on a fresh machine.
host="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Zsanitizer=address -Cdebug-assertions \
-Coverflow-checks"
mkdir -p "${TARGET_DIR}"
cargo build --release --bins --target "${host}" --target-dir "${TARGET_DIR}"
targets="$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^aggregation-gateway-fuzz$')"
for target in ${targets}; do
  runs="${RUNS_PER_TARGET:-$(default_runs "${target}")}"
  echo "== fuzzing ${target}: ${runs} runs from seed ${SEED}"
  corpus="$(mktemp -d)"
  "${TARGET_DIR}/${host}/release/${target}" "${corpus}" \
    -seed="${SEED}" -runs="${runs}" -max_len=4096 -print_final_stats=1
  rm -rf "${corpus}"
  echo "== ${target}: ${SECONDS}s since the start"
done
echo "fuzzing: all targets ran without a finding"
