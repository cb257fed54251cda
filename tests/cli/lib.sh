# Helpers for CLI tests: source it, call the checks, end with `finish`.
# Each check runs a real binary and compares its exit code and output.
set -u
BIN=${DSTK_BIN:?set DSTK_BIN to the bin directory of a build}
SHARED=${DSTK_SHARED_DIR:-}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dstk-cli.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FAILED=0
CHECKS=0
OUT="$WORK/.stdout"
ERR="$WORK/.stderr"

fail() {
    echo "FAIL: $*" >&2
    echo "--- stdout:" >&2; head -c 3000 "$OUT" >&2 2>/dev/null
    echo "--- stderr:" >&2; head -c 3000 "$ERR" >&2 2>/dev/null
    FAILED=$((FAILED + 1))
}

# expect_exit CODE cmd args...: runs the command, captures stdout/stderr.
expect_exit() {
    local want=$1
    shift
    CHECKS=$((CHECKS + 1))
    "$@" >"$OUT" 2>"$ERR" </dev/null
    local got=$?
    [ "$got" -eq "$want" ] || fail "exit $got, expected $want: $*"
    return 0
}

# Patterns are extended regular expressions matched against the last command's output.
expect_stdout() { CHECKS=$((CHECKS + 1)); grep -Eq -- "$1" "$OUT" || fail "stdout does not match /$1/"; }
expect_stderr() { CHECKS=$((CHECKS + 1)); grep -Eq -- "$1" "$ERR" || fail "stderr does not match /$1/"; }
expect_no_stdout() { CHECKS=$((CHECKS + 1)); [ ! -s "$OUT" ] || fail "stdout should be empty"; }
expect_file() { CHECKS=$((CHECKS + 1)); [ -e "$1" ] || fail "missing file $1"; }
expect_no_file() { CHECKS=$((CHECKS + 1)); [ ! -e "$1" ] || fail "file should not exist: $1"; }
expect_differ() { CHECKS=$((CHECKS + 1)); ! cmp -s "$1" "$2" || fail "files should differ: $1 $2"; }
expect_same() { CHECKS=$((CHECKS + 1)); cmp -s "$1" "$2" || fail "files differ: $1 $2"; }
expect_true() { # expect_true "description" test-args...
    local what=$1
    shift
    CHECKS=$((CHECKS + 1))
    "$@" || fail "$what"
}

# A python3 that has numpy, or empty.
numpy_python() {
    local p
    for p in python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import numpy' >/dev/null 2>&1; then
            echo "$p"
            return
        fi
    done
}

# A python with matplotlib (build/venv's first), or empty; `plot_python
# package`: one that also imports the installed dstk package (python -m dstk.plot).
plot_python() {
    local p root want='import matplotlib'
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    [ "${1:-}" = package ] && want='import matplotlib, dstk.plot'
    for p in "$root/build/venv/bin/python" python3 /usr/bin/python3; do
        if "$p" -c "$want" >/dev/null 2>&1; then
            echo "$p"
            return
        fi
    done
}

# run_measuring_rss cmd args...: runs the command (stdout discarded, stderr
# to $ERR) and sets RSS_RC (its exit code) and RSS_BYTES (its peak RSS,
# children included, from python3's resource module).
run_measuring_rss() {
    local py
    py=$(command -v python3 || echo /usr/bin/python3)
    "$py" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
' "$@" >"$WORK/.rss" 2>"$ERR"
    read -r RSS_RC RSS_BYTES <"$WORK/.rss"
}

skip() { echo "SKIP: $*" >&2; exit 77; }

# ---- Documented command lines (test_readme.sh, test_man_examples.sh) ----
# Such a test defines SKIP (substrings of the lines that cannot run here, each
# with its reason) and rewrite (a line -> the same line at test size), then
# calls run_doc_line on each line.

# need_doc_tools WHY: skips unless the five tools, a python3 with numpy (set as
# PY) and MNIST in the shared folder (set as MNIST; WHY says what needs it) are here.
need_doc_tools() {
    local t
    for t in dsgen dsconvert dsplan dsbench dstrain; do [ -x "$BIN/$t" ] || skip "no $t binary in $BIN"; done
    PY=$(numpy_python)
    [ -n "$PY" ] || skip "numpy is needed for the .npz fixtures"
    MNIST=${SHARED:+$SHARED/data/mnist}
    [ -n "$MNIST" ] && [ -f "$MNIST/t10k-images-idx3-ubyte.gz" ] || skip "no MNIST in DSTK_SHARED_DIR ($1)"
}

# Shell lines on stdin without their comments and blank lines.
strip_shell_comments() { sed -E 's/[[:space:]]+#[[:space:]].*$//' | grep -v '^[[:space:]]*$'; }

# The sed script that makes every dstrain line (but eval and predict) train 1 epoch on 2 CPU threads.
DSTRAIN_ONE_EPOCH='/(^|[ &])dstrain (eval|predict) /!{/(^|[ &])dstrain /{s/ --epochs [0-9]+//g; s/(dstrain [^ ]+)/\1 --epochs 1 -T 2/g}}'

# make_npz_fixtures [PYTHON]: data.npz (x_train, y_train) and cols.bin in the
# current directory, then PYTHON (with np and r, a seeded generator) for the
# test's own fixtures.
make_npz_fixtures() {
    "$PY" -c '
import numpy as np
r = np.random.default_rng(1)
np.savez("data.npz", x_train=r.random((200, 1, 8, 8), dtype=np.float32), y_train=r.integers(0, 4, 200).astype(np.int32))
r.random((784 * 64,), dtype=np.float32).tofile("cols.bin")
'"${1:-}"
}

# run_doc_line LINE: returns 1 (and says so) if LINE is listed in SKIP; else
# runs $(rewrite LINE) through bash, set as DOC_CMD, and expects exit 0 (a
# `--check ... || exit` gate answers with its exit status: 0 or 3).
run_doc_line() {
    local line=$1 s
    for s in "${SKIP[@]}"; do
        if [[ "$line" == *"$s"* ]]; then
            echo "skipped (listed): $line"
            return 1
        fi
    done
    DOC_CMD=$(rewrite "$line")
    if [[ "$line" == *"--check"*"|| exit" ]]; then
        expect_exit 0 bash -c "( $DOC_CMD ); r=\$?; [ \$r -eq 0 ] || [ \$r -eq 3 ]"
    else
        expect_exit 0 bash -c "$DOC_CMD"
    fi
}

finish() {
    if [ "$FAILED" -gt 0 ]; then
        echo "$FAILED of $CHECKS checks failed" >&2
        exit 1
    fi
    echo "$CHECKS checks passed"
    exit 0
}
