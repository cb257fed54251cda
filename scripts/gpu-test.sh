#!/usr/bin/env bash
# On a machine with a GPU: configure, build, run the tests labelled `gpu`, then
# the GPU benchmarks, in one command meant to finish within 10 minutes.
# Logs go to LOG_DIR (default $OUT when set, else build-gpu/logs); a short
# table of what ran is printed last.
#   scripts/gpu-test.sh [LOG_DIR]
#   DSTK_CUDA_ARCHS   architectures to build (default: native)
#   DSTK_GPU_BENCH    which benchmarks: all (default), none, or names among
#                     dsgen-speed dsbench-gpu bench-train bench-datapath bench-convert model-check
#                     kernel-choice (issue 18: 10 fresh processes per precision from
#                     an empty kernel choice cache; not in "all", ~4 minutes)
#                     bench-larger-than-ram (issue 13: root, cgroup v2; not in "all", ~7 minutes)
#                     loader-cgroup (issue 23: dsbench's loader.stream.chunk against the disk's
#                     random chunks on 2 CPUs in a 512 MiB cgroup, scripts/bench-loader-cgroup.sh;
#                     root; not in "all", ~3 minutes)
#                     bench-mix (issue 25: a mix of four members totalling 4x a memory cgroup
#                     against one member on the device, scripts/bench-mix.sh; root; not in
#                     "all", ~3 minutes; DSTK_MIX_WAYS="dstrain python" adds dstk.Loader on
#                     the mix into a compiled PyTorch loop, with "python" named too, ~4 more)
#                     bench-dist (issue 17: the N=1 NCCL path against the plain one,
#                     scripts/bench-dist.sh; not in "all", ~4 minutes)
#                     python-loader (only when named: builds the Python package offline
#                     into python3, runs its tests and scripts/bench-python-loader.py
#                     with DSTK_PY_ARGS, e.g. "--runs 3 --seconds 3";
#                     DSTK_PY_CGROUP=4G adds its larger-than-RAM run)
#                     python (only when named; python-loader implies it): the package
#                     built offline into python3 and its tests (python/tests, tests/python)
#   DSTK_GPU_TESTS    0 to skip ctest -L gpu (e.g. a second call for benchmarks)
#   DSTK_PY_TESTS     0 to skip the Python package's tests (the package is still installed)
#   DSTK_CURVE, DSTK_BENCH_TASKS, DSTK_MEMMAP, DSTK_BENCH_RUNS, DSTK_BENCH_PRECISIONS:
#                     bench-train's CURVE, TASKS, MEMMAP, RUNS and PRECISIONS
#   DSTK_BASELINE     a tarball of another tree (git archive REV > .baseline/base.tar,
#                     carried): built into build-base, and bench-train runs its dstrain
#                     alternating with this tree's (a change measured on the same machine)
# Carried files for a machine without network: .whl/ (nanobind, scikit-build-core
# for python-loader) and .deb/libxxhash-dev_*.deb (apt-get download libxxhash-dev)
# where the machine has no libxxhash-dev.
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

# libxxhash-dev where the machine lacks it (it has no network): from .deb/
# (apt-get download libxxhash-dev, on a machine with one), unpacked into
# build-gpu/deps and linked statically.
deps_args=()
if ! pkg-config --exists libxxhash 2>/dev/null && compgen -G ".deb/libxxhash-dev_*.deb" >/dev/null; then
    mkdir -p build-gpu/deps
    for f in .deb/libxxhash-dev_*.deb; do dpkg -x "$f" build-gpu/deps; done
    deps_args+=("-DDSTK_XXHASH_ROOT=$PWD/build-gpu/deps/usr")
fi
SUMMARY_RE='dstk:' step configure 120 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${DSTK_CUDA_ARCHS:-native}" "${deps_args[@]}"
SUMMARY_RE='Built target|error' step build 420 cmake --build build-gpu -j"$(nproc)" || {
    grep -E 'error' -A3 "$log/build.log" | head -40 >&2
    cat "$table"
    exit 1
}
if [ -n "${DSTK_BASELINE:-}" ]; then
    SUMMARY_RE='Built target|error|built before' step baseline-build 420 bash -c '
        if [ -x build-base/bin/dstrain ] && cmp -s "$1" build-base/src.tar; then echo "built before"; exit 0; fi
        rm -rf build-base && mkdir -p build-base/src && tar xf "$1" -C build-base/src && cp "$1" build-base/src.tar &&
        xx=(); [ -d build-gpu/deps/usr ] && xx=(-DDSTK_XXHASH_ROOT="$PWD/build-gpu/deps/usr") # as above
        cmake -S build-base/src -B build-base -DCMAKE_BUILD_TYPE=Release -DDSTK_TESTS=OFF "${xx[@]}" \
            -DCMAKE_CUDA_ARCHITECTURES="${DSTK_CUDA_ARCHS:-native}" >/dev/null &&
        cmake --build build-base -j"$(nproc)" --target dstrain dsgen' _ "$DSTK_BASELINE"
fi
if [ "${DSTK_GPU_TESTS:-1}" != 0 ]; then
    SUMMARY_RE='tests passed|tests failed' step ctest-gpu 300 ctest --test-dir build-gpu -L gpu --output-on-failure
    grep -E 'Failed|\*\*\*' "$log/ctest-gpu.log" | head -20 >&2
fi

benches=${DSTK_GPU_BENCH:-all}
want() { [ "$benches" = all ] || [[ " $benches " == *" $1 "* ]]; }
named() { [[ " $benches " == *" $1 "* ]]; }

if [ "$benches" != none ]; then
    export DSTK_BIN=$PWD/build-gpu/bin
    work=/dev/shm/dstk-gpu-test
    rm -rf "$work" && mkdir -p "$work"
    want dsgen-speed && SUMMARY_RE='GB/s' step dsgen-speed 120 bash -c '
        "$DSTK_BIN/dsgen" '"$work"'/gen1 --train 1M --test 0 -T 1 --force &&
        "$DSTK_BIN/dsgen" '"$work"'/gen16 --train 4M --test 0 --force; rm -rf '"$work"'/gen1 '"$work"'/gen16'
    want dsbench-gpu && SUMMARY_RE='h2d.pinned .*256' step dsbench-gpu 150 "$DSTK_BIN/dsbench" all --cases h2d,decode.convert \
        --json "$log/bench-gpu.json" --force
    bench_env=(TRAIN=50000 EPOCHS=3 RUNS="${DSTK_BENCH_RUNS:-5}" TORCH_RUNS=1
               PRECISIONS="${DSTK_BENCH_PRECISIONS:-tf32 bf16}")
    [ -n "${DSTK_BASELINE:-}" ] && bench_env+=(BASELINE=build-base)
    [ -n "${DSTK_CURVE:-}" ] && bench_env+=(CURVE="$DSTK_CURVE")
    [ -n "${DSTK_BENCH_TASKS:-}" ] && bench_env+=(TASKS="$DSTK_BENCH_TASKS")
    [ -n "${DSTK_MEMMAP:-}" ] && bench_env+=(MEMMAP="$DSTK_MEMMAP")
    want bench-train && SUMMARY_RE='tf32|bf16|FAILED' step bench-train 540 env "${bench_env[@]}" \
        scripts/bench-train.sh build-gpu "$work/train"
    named kernel-choice && SUMMARY_RE='bf16/tf32|FAIL' step kernel-choice 420 scripts/bench-kernel-choice.sh build-gpu "$log"
    named bench-dist && SUMMARY_RE='mpirun -np 1 / plain|FAIL' step bench-dist 360 scripts/bench-dist.sh build-gpu/bin "$log"
    named loader-cgroup && SUMMARY_RE='median' step loader-cgroup 300 env CPUS=0,1 \
        scripts/bench-loader-cgroup.sh build-gpu/bin "$log/loader-cgroup"
    want bench-datapath && [ -x scripts/bench-gpu-datapath.sh ] && SUMMARY_RE='stream|1%' step bench-datapath 270 \
        scripts/bench-gpu-datapath.sh "$log"
    want bench-convert && SUMMARY_RE='bf16|MB/s' step bench-convert 120 scripts/bench-convert.sh "$DSTK_BIN"
    if named python || named python-loader; then
        # The package into the python3 that holds PyTorch, offline (no build
        # isolation), linking build-gpu's library (built above; nothing compiled
        # twice); nanobind (2 or newer) and scikit-build-core from .whl/ where
        # that python3 lacks them (it holds pytest).
        export PIP_BREAK_SYSTEM_PACKAGES=1
        SUMMARY_RE='Successfully|rror' step python-install 300 bash -c '
            wheel() { python3 -m pip install -q --no-index --find-links .whl "$1"; }
            python3 -c "import nanobind, sys; sys.exit(int(nanobind.__version__.split(chr(46))[0]) < 2)" ||
                wheel "nanobind>=2" || exit 1
            python3 -c "import scikit_build_core" || wheel scikit-build-core || exit 1
            python3 -c "import nanobind, pytest; print(nanobind.__version__)" || exit 1
            python3 -m pip install -v --no-build-isolation --no-deps --no-index \
                -C cmake.define.DSTK_BUILD_DIR="$PWD/build-gpu" ./python'
        [ "${DSTK_PY_TESTS:-1}" = 0 ] ||
            SUMMARY_RE='passed|failed' step python-tests 240 python3 -m pytest -q python/tests tests/python
    fi
    if named python-loader; then
        SUMMARY_RE='dstk / reference' step python-loader 450 python3 scripts/bench-python-loader.py --out "$log/python-loader" \
            ${DSTK_PY_CGROUP:+--cgroup-limit "$DSTK_PY_CGROUP"} ${DSTK_PY_ARGS:-}
    fi
    # After the package's install: DSTK_MIX_WAYS="dstrain python" adds the Loader's run.
    named bench-mix && SUMMARY_RE='target|ceiling|within|OVER' step bench-mix 570 env WAYS="${DSTK_MIX_WAYS:-dstrain}" \
        scripts/bench-mix.sh build-gpu/bin "$log/mix"
    want model-check && SUMMARY_RE='model-check' step model-check 150 scripts/model-check.sh "$DSTK_BIN" "$work/model" "$log"
    rm -rf "$work"
    # Not part of "all": it needs root and most of a call's 10 minutes.
    named bench-larger-than-ram && SUMMARY_RE='u8 .*chunk|f32 .*chunk' \
        step bench-larger-than-ram 540 scripts/bench-larger-than-ram.sh build-gpu/bin "$log/ltr"
    [ -f "$log/ltr/table.txt" ] && cat "$log/ltr/disk.txt" "$log/ltr/table.txt" "$log/ltr/prediction.txt" 2>/dev/null
fi

echo
echo "step                         result   seconds  last line"
cat "$table"
exit $status
