#!/usr/bin/env bash
# On a machine with a GPU: configure, build, run the tests labelled `gpu`, then
# the GPU benchmarks, in one command meant to finish within 10 minutes.
# Logs go to LOG_DIR (default $OUT when set, else build-gpu/logs); a short
# table of what ran is printed last.
#   scripts/gpu-test.sh [LOG_DIR]
#   DSTK_CUDA_ARCHS   architectures to build (default: native)
#   DSTK_GPU_BENCH    0 to skip the benchmarks
set -uo pipefail
cd "$(dirname "$0")/.."
log=${1:-${OUT:-build-gpu/logs}}
mkdir -p "$log"
table="$log/summary.txt"
: >"$table"
status=0
row() { printf '%-28s %-8s %7ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$table" >/dev/null; }

# step NAME LIMIT_SECONDS command...: runs with a time limit, logs to NAME.log.
step() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name" >&2
    timeout "$limit" "$@" >"$log/$name.log" 2>&1
    local rc=$?
    local result=ok
    [ $rc -eq 124 ] && result=timeout
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && result="rc=$rc"
    [ $rc -ne 0 ] && status=1
    row "$name" "$result" $((SECONDS - t0)) "$(grep -E "${SUMMARY_RE:-tests passed|passed|samples/s|GB/s}" "$log/$name.log" | tail -1 | cut -c1-90)"
    return $rc
}

nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader >"$log/gpu.txt" 2>&1 || true
scripts/setup.sh >"$log/setup.log" 2>&1 || echo "setup: see $log/setup.log (continuing: the build says what is missing)" >&2

SUMMARY_RE='dstk:' step configure 120 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${DSTK_CUDA_ARCHS:-native}"
SUMMARY_RE='Built target|error' step build 420 cmake --build build-gpu -j"$(nproc)" || {
    grep -E 'error' -A3 "$log/build.log" | head -40 >&2
    cat "$table"
    exit 1
}
SUMMARY_RE='tests passed|tests failed' step ctest-gpu 300 ctest --test-dir build-gpu -L gpu --output-on-failure
grep -E 'Failed|\*\*\*' "$log/ctest-gpu.log" | head -20 >&2

if [ "${DSTK_GPU_BENCH:-1}" != 0 ]; then
    export DSTK_BIN=$PWD/build-gpu/bin
    SUMMARY_RE='GB/s' step dsgen-speed 120 bash -c '
        rm -rf /dev/shm/dstk-gen && "$DSTK_BIN/dsgen" /dev/shm/dstk-gen --train 1M --test 0 -T 1 &&
        rm -rf /dev/shm/dstk-gen && "$DSTK_BIN/dsgen" /dev/shm/dstk-gen --train 4M --test 0; rm -rf /dev/shm/dstk-gen'
    for s in scripts/bench-gpu-*.sh; do
        [ -x "$s" ] || continue
        step "$(basename "$s" .sh)" 240 "$s" "$log"
    done
fi

echo
echo "step                         result   seconds  last line"
cat "$table"
exit $status
