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

finish() {
    if [ "$FAILED" -gt 0 ]; then
        echo "$FAILED of $CHECKS checks failed" >&2
        exit 1
    fi
    echo "$CHECKS checks passed"
    exit 0
}
