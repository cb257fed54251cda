#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages dstk needs, and only those missing:
# apt-get runs only when something is missing (the GPU test machine has no
# network but has everything). Usage: scripts/setup.sh [--test | --demo]
#   --demo  also Python 3 with matplotlib (the demo draws demo-out/curves.png)
#   --test  also what the tests need, and build/venv for pytest
set -euo pipefail

# Open MPI: data-parallel dstrain (mpirun); the build works without it, in one process.
packages=(build-essential cmake pkg-config libcli11-dev libzstd-dev libhwloc-dev zlib1g-dev nlohmann-json3-dev zstd
          libxxhash-dev openmpi-bin libopenmpi-dev)
# Pictures (python/dstk/plot.py): the demo's curves.png, dsbench compare --plot, their tests.
case "${1:-}" in --demo | --test) packages+=(python3 python3-matplotlib) ;; esac
if [ "${1:-}" = "--test" ]; then
    # Tests: GoogleTest, numpy for interop checks, clang for the fuzzers, xxhsum
    # to cross-check checksums, jq for the CLI tests that read JSON.
    packages+=(libgtest-dev python3 python3-numpy clang libclang-rt-dev xxhash jq)
    # The Python package (python/): headers to build it, venv for build/venv.
    packages+=(python3-dev python3-venv)
fi

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# What counts as present: the package, or what it provides found by other
# means (the GPU machine has CMake in /usr/local, libraries built from source,
# PyTorch's python3).
header() { for d in /usr/include /usr/local/include /usr/include/x86_64-linux-gnu; do [ -e "$d/$1" ] && return 0; done; return 1; }
provided() {
    case "$1" in
        build-essential) command -v c++ >/dev/null 2>&1 && command -v make >/dev/null 2>&1 ;;
        cmake | pkg-config | zstd | python3) command -v "$1" >/dev/null 2>&1 ;;
        clang) command -v clang++ >/dev/null 2>&1 ;;
        libclang-rt-dev) compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null ;;
        xxhash) command -v xxhsum >/dev/null 2>&1 ;;
        jq) command -v jq >/dev/null 2>&1 ;;
        openmpi-bin) command -v mpirun >/dev/null 2>&1 ;;
        libopenmpi-dev) command -v mpicc >/dev/null 2>&1 || header mpi.h ;;
        libcli11-dev) header CLI/CLI.hpp ;;
        libzstd-dev) header zstd.h ;;
        libhwloc-dev) header hwloc.h ;;
        zlib1g-dev) header zlib.h ;;
        nlohmann-json3-dev) header nlohmann/json.hpp ;;
        libgtest-dev) header gtest/gtest.h ;;
        python3-numpy) python3 -c 'import numpy' >/dev/null 2>&1 || /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 ;;
        python3-matplotlib) python3 -c 'import matplotlib' >/dev/null 2>&1 || /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 ;;
        libxxhash-dev) header xxhash.h ;;
        python3-dev) python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' >/dev/null 2>&1 ;;
        python3-venv) python3 -c 'import ensurepip, venv' >/dev/null 2>&1 ;;
        *) return 1 ;;
    esac
}

missing=()
for p in "${packages[@]}"; do
    provided "$p" || have_pkg "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: missing ${missing[*]} and no apt-get here; install them by hand" >&2
    exit 1
fi
if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all packages present"
else
    echo "setup: installing ${missing[*]}"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
        sudo="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---- Python (tests): a venv at build/venv that sees the system's packages
# (numpy, PyTorch where installed); pip installs only what is missing there
# (Debian 12 refuses pip installs into the system Python, PEP 668).
if [ "${1:-}" = "--test" ]; then
    venv=$(cd "$(dirname "$0")/.." && pwd)/build/venv
    [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
    pip_missing=()
    # matplotlib: the pictures' tests; tensorboard: reads dstrain's event
    # files back; lizard: the function-length check (scripts/check-function-length.py).
    for spec in nanobind:nanobind scikit-build-core:scikit_build_core numpy:numpy pytest:pytest \
        safetensors:safetensors onnxruntime:onnxruntime matplotlib:matplotlib tensorboard:tensorboard lizard:lizard \
        scikit-learn:sklearn; do
        "$venv/bin/python" -c "import ${spec#*:}" >/dev/null 2>&1 || pip_missing+=("${spec%%:*}")
    done
    if [ ${#pip_missing[@]} -gt 0 ]; then
        echo "setup: pip installing ${pip_missing[*]} into build/venv"
        "$venv/bin/python" -m pip install -q "${pip_missing[@]}"
    fi
fi
