#!/usr/bin/env bash
# The README's test command: installs what is missing, builds into build/,
# runs every test (unit, CLI, real-data; GPU tests skip with a reason where
# there is no GPU), then a short run of each fuzzer.
#   DSTK_FUZZ_SECONDS  seconds per fuzzer (default 10, one fuzzer per core at a time; 0 skips fuzzing;
#                      a longer run searches deeper: the corpora in tests/fuzz/corpus seed each run)
#   DSTK_CUDA_ARCHS    CUDA architectures to compile (default: the project's
#                      80;86;89;90 where a GPU is present, else 90 alone; see
#                      scripts/configure.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's wall time, printed at the end: CI's budget is the sum.
steps=() last=$SECONDS
took() { steps+=("$1 $((SECONDS - last)) s"); last=$SECONDS; }
scripts/setup.sh --test
took setup

jobs=$(nproc)
echo "== build (build/)"
source scripts/configure.sh
cmake --build build -j"$jobs"
took build

# ---- Python: the package installed into build/venv, linking the library
# built above (DSTK_BUILD_DIR: nothing is compiled twice), reinstalled only
# when it or the library changed (before ctest: the README's test runs
# python -m dstk.plot).
echo "== python package (build/venv)"
stamp=build/python/installed.stamp
if [ ! -f "$stamp" ] || [ -n "$(find python/src python/dstk python/CMakeLists.txt python/pyproject.toml \
    build/lib/libdstk.a -newer "$stamp" -print -quit)" ]; then
    CMAKE_ARGS="-DDSTK_BUILD_DIR=$PWD/build" build/venv/bin/python -m pip install -q --no-build-isolation --no-deps ./python
    touch "$stamp"
else
    echo "(the package in build/venv is up to date)"
fi
took python-package

echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900
took ctest

# One pytest over the package's tests and the tools' Python-side tests (tests/python).
echo "== python tests"
py_dirs=(python/tests tests/python)
rc=0
# Its temporary directories under build/ (cleared by the next run), not in /tmp.
DSTK_BIN=$PWD/build/bin build/venv/bin/python -m pytest -q --basetemp="$PWD/build/pytest-tmp" "${py_dirs[@]}" || rc=$?
# pytest exits 5 when it collected nothing: a broken test tree, never a pass.
[ "$rc" -eq 5 ] && echo "pytest collected no tests in ${py_dirs[*]} (import errors? files renamed?)" >&2
[ "$rc" -eq 0 ] || exit 1
took pytest

seconds=${DSTK_FUZZ_SECONDS:-10}
if [ "$seconds" -gt 0 ] && command -v clang++ >/dev/null 2>&1; then
    echo "== fuzzers (${seconds} s each)"
    # -O1 with assertions on (no NDEBUG): what libFuzzer's docs suggest, and
    # quicker to compile than an optimised build with full debug info.
    cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS=-O1 -DCMAKE_CXX_FLAGS=-O1 \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DDSTK_FUZZ=ON -DDSTK_CUDA=OFF -DDSTK_TOOLS=OFF "${launcher[@]}" >build-fuzz-configure.log 2>&1 ||
        { cat build-fuzz-configure.log; exit 1; }
    targets=$(for f in tests/fuzz/fuzz_*.cpp; do basename "$f" .cpp; done)
    cmake --build build-fuzz -j"$jobs" --target $targets
    # One fuzzer per core at a time (each is one process on one core).
    fuzz_one() {
        local t=$1 corpus=build-fuzz/corpus/$1
        mkdir -p "$corpus"
        [ -d "tests/fuzz/corpus/$t" ] && cp -r "tests/fuzz/corpus/$t/." "$corpus/"
        build-fuzz/fuzz/$t -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 "$corpus" 2>build-fuzz/$t.log
    }
    pids=() names=()
    for t in $targets; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
        fuzz_one "$t" &
        pids+=($!) names+=("$t")
    done
    failed=0
    for i in "${!pids[@]}"; do
        t=${names[$i]}
        if wait "${pids[$i]}"; then
            echo "-- $t: $(grep -E 'stat::number_of_executed_units' build-fuzz/$t.log || true)"
        else
            tail -50 "build-fuzz/$t.log"
            echo "fuzzer $t found a crash" >&2
            failed=1
        fi
    done
    [ "$failed" -eq 0 ] || exit 1
    took fuzzers
fi
echo "== all tests passed ($(IFS=,; echo "${steps[*]}" | sed 's/,/, /g'); ${SECONDS} s in all)"
