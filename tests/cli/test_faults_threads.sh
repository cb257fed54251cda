#!/usr/bin/env bash
# Nothing ends in an abort: where the system refuses a thread (a container's
# pids limit, a process at its thread limit), the tools that start reader,
# I/O or worker threads stop those already started and exit 1 with a
# message naming the threads, at whichever thread the refusal comes; they
# never end in std::terminate (exit 134) or hang (every run under timeout).
# The refusal is tests/support/fail_threads.c, preloaded.
source "$(dirname "$0")/lib.sh"
SHIM=$(cd "$(dirname "$0")/../support" && pwd)/fail_threads.c
for t in dsgen dsbench dstrain; do [ -x "$BIN/$t" ] || skip "no $t binary in $BIN"; done
CC=$(command -v cc || command -v gcc || true)
[ -n "$CC" ] || skip "no C compiler to build the preloaded fault"
cd "$WORK"
"$CC" -shared -fPIC -O1 -o fail_threads.so "$SHIM" -ldl ||
    { echo "cannot build fail_threads.so" >&2; exit 1; }
FAULT="$WORK/fail_threads.so"
"$BIN/dsgen" ds --train 2048 --test 64 --shape 1x8x8 --classes 4 --seed 5 -q || { echo "dsgen failed" >&2; exit 1; }

# refused LEFT cmd...: runs cmd with LEFT threads allowed; exit 0 (every
# thread it needed started) or 1 with the message, never anything else.
refused() {
    local left=$1
    shift
    CHECKS=$((CHECKS + 1))
    LD_PRELOAD="$FAULT" DSTK_TEST_THREADS_LEFT=$left timeout 60 "$@" >"$OUT" 2>"$ERR" </dev/null
    local got=$?
    if [ "$got" -eq 1 ]; then
        grep -Eq "cannot start .*thread" "$ERR" || fail "exit 1 without the message, $left threads left: $*"
        REFUSED=$((REFUSED + 1))
    elif [ "$got" -ne 0 ]; then
        fail "exit $got with $left threads left (expected 0, or 1 with a message): $*"
    fi
}

REFUSED=0
for left in 0 1 2 3 4 6; do
    refused "$left" "$BIN/dsbench" all ds --cases 'loader.stream.chunk' --repetitions 1 --min-time 0 --json b.json --force -q
    refused "$left" "$BIN/dstrain" ds --model flatten,fc:4 --device cpu --epochs 1 --batch 64 --data stream -q
    refused "$left" "$BIN/dsgen" g$left --train 4096 --test 64 --shape 1x8x8 --classes 4 -T 4 -q
done
# The fault is real: with no thread left, each of them was refused.
expect_true "no run was refused (is the preload working?)" [ "$REFUSED" -ge 3 ]
finish
