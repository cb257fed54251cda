#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages dstk needs, and only those missing:
# apt-get runs only when something is missing (the GPU test machine has no
# network but has everything). Usage: scripts/setup.sh [--test]
set -euo pipefail

packages=(build-essential cmake pkg-config libcli11-dev libzstd-dev libhwloc-dev zlib1g-dev nlohmann-json3-dev zstd)
if [ "${1:-}" = "--test" ]; then
    # Tests: GoogleTest, numpy for interop checks, clang for the fuzzers, xxhsum
    # to cross-check checksums, jq for the CLI tests that read JSON.
    packages+=(libgtest-dev python3 python3-numpy python3-venv clang libclang-rt-dev xxhash jq)
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
        libcli11-dev) header CLI/CLI.hpp ;;
        libzstd-dev) header zstd.h ;;
        libhwloc-dev) header hwloc.h ;;
        zlib1g-dev) header zlib.h ;;
        nlohmann-json3-dev) header nlohmann/json.hpp ;;
        libgtest-dev) header gtest/gtest.h ;;
        python3-numpy) python3 -c 'import numpy' >/dev/null 2>&1 || /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 ;;
        python3-venv) python3 -c 'import venv, ensurepip' >/dev/null 2>&1 ;;
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

# The Python tests (tests/python): pytest, numpy, safetensors and onnxruntime
# from PyPI, only those python3 lacks, into a virtual environment (.venv-test,
# beside the system's packages: Debian's python3 refuses pip installs of its
# own); scripts/test.sh runs pytest with it when it exists.
if [ "${1:-}" = "--test" ]; then
    py_missing=()
    for m in pytest numpy safetensors onnxruntime; do
        python3 -c "import $m" >/dev/null 2>&1 || py_missing+=("$m")
    done
    if [ ${#py_missing[@]} -gt 0 ]; then
        venv=.venv-test
        [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
        still=()
        for m in "${py_missing[@]}"; do "$venv/bin/python" -c "import $m" >/dev/null 2>&1 || still+=("$m"); done
        if [ ${#still[@]} -gt 0 ]; then
            echo "setup: pip installing ${still[*]} into $venv"
            "$venv/bin/python" -m pip install -q "${still[@]}"
        fi
    fi
fi
