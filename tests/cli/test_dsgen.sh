#!/usr/bin/env bash
# dsgen on the real binary: exit codes, messages, determinism, atomicity.
. "$(dirname "$0")/lib.sh"
G=$BIN/dsgen

expect_exit 0 "$G" --help
expect_stdout "OUT_DIR"
expect_stdout "--layout"
expect_exit 0 "$G" --version
expect_stdout "dsgen \(dstk\) [0-9]"

# Usage errors: exit 2, a message naming the problem, nothing written.
expect_exit 2 "$G"
expect_stderr "OUT_DIR"
expect_exit 2 "$G" "$WORK/bad" --dtype u7
expect_stderr "unknown --dtype 'u7'"
expect_exit 2 "$G" "$WORK/bad" --shape 3x0x32
expect_stderr "at least 1"
expect_exit 2 "$G" "$WORK/bad" --train -5
expect_stderr "cannot be negative"
expect_exit 2 "$G" "$WORK/bad" --train 1.5
expect_stderr "whole number"
expect_exit 2 "$G" "$WORK/bad" --kind tabular --dtype u8
expect_stderr "floating-point"
expect_exit 2 "$G" "$WORK/bad" --kind bytes --noise 0.5
expect_exit 2 "$G" "$WORK/bad" --no-such-option
expect_exit 2 "$G" "$WORK/bad" --train 10G --shape 100000x100000x100000
expect_stderr "overflows 64 bits"
expect_no_file "$WORK/bad"

# Not enough disk: exit 3 before writing anything (3 PB requested).
expect_exit 3 "$G" "$WORK/huge" --train 1G --shape 3x1000x1000
expect_stderr "not enough free disk"
expect_no_file "$WORK/huge"

# A small dataset; the summary line is a note on stderr (stdout stays empty).
expect_exit 0 "$G" "$WORK/a" --train 3000 --test 500 --threads 1
expect_stderr "^dsgen: 3,500 samples, .* GB/s"
expect_no_stdout
for f in dataset.json train_x.npy train_y.npy test_x.npy test_y.npy; do expect_file "$WORK/a/$f"; done
expect_true "no temporary files left" test -z "$(ls -A "$WORK" | grep tmp)"

# Refuses to overwrite; --force replaces.
expect_exit 2 "$G" "$WORK/a" --train 10 --test 0
expect_stderr "already exists"
expect_exit 0 "$G" "$WORK/a" --train 3000 --test 500 --threads 2 --force

# Deterministic whatever the thread count; another seed changes the data.
expect_exit 0 "$G" "$WORK/b" --train 3000 --test 500 --threads 3
expect_exit 0 "$G" "$WORK/c" --train 3000 --test 500 --threads 2 --seed 7
for f in train_x.npy train_y.npy test_x.npy test_y.npy; do expect_same "$WORK/a/$f" "$WORK/b/$f"; done
expect_differ "$WORK/a/train_x.npy" "$WORK/c/train_x.npy"
for dt in f32 bf16 f16; do
    expect_exit 0 "$G" "$WORK/$dt-1" --train 700 --test 0 --dtype $dt --threads 1 -q
    expect_exit 0 "$G" "$WORK/$dt-2" --train 700 --test 0 --dtype $dt --threads 2 -q
    expect_same "$WORK/$dt-1/train_x.npy" "$WORK/$dt-2/train_x.npy"
done
expect_exit 0 "$G" "$WORK/tab" --kind tabular --shape 64 --train 1000 --test 100 -q
expect_exit 0 "$G" "$WORK/bytes" --kind bytes --shape 4096 --train 100 --test 0 -q

# --progress forces progress on stderr when it is not a terminal; -q silences it.
expect_exit 0 "$G" "$WORK/p" --train 20000 --test 0 --progress
expect_stderr "dsgen: .*%"
expect_exit 0 "$G" "$WORK/p" --train 20000 --test 0 --progress -q --force
CHECKS=$((CHECKS + 1))
[ ! -s "$ERR" ] || fail "--quiet should silence progress"

# --json prints one parseable document.
expect_exit 0 "$G" "$WORK/j" --train 100 --test 10 --json
PY=$(command -v python3 || echo /usr/bin/python3)
expect_true "--json parses" "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["samples"] == 110, d' "$OUT"

# Checksums in the manifest are xxh64 of each file (as `xxhsum -H1` prints).
if command -v xxhsum >/dev/null; then
    want=$(xxhsum -H1 "$WORK/a/train_x.npy" | cut -d' ' -f1)
    expect_true "manifest checksum equals xxhsum -H1" grep -q "xxh64:$want" "$WORK/a/dataset.json"
fi

# The v28b feature-major files hold the same values, column-major, as f32.
expect_exit 0 "$G" "$WORK/v28" --train 300 --test 50 --shape 1x4x4 --layout feature-major -q
expect_file "$WORK/v28/images_train.bin"
expect_true "images_train.bin size" test "$(stat -c %s "$WORK/v28/images_train.bin")" -eq $((300 * 16 * 4))
expect_true "labels_test.bin size" test "$(stat -c %s "$WORK/v28/labels_test.bin")" -eq $((50 * 4))

# Ctrl-C: exit 130 and no dataset, no temporary directory.
"$G" "$WORK/int" --train 20M --test 0 --force -q >/dev/null 2>"$ERR" &
pid=$!
sleep 1
kill -INT $pid
wait $pid
rc=$?
CHECKS=$((CHECKS + 1))
[ "$rc" -eq 130 ] || fail "SIGINT exit $rc, expected 130"
expect_stderr "interrupted"
expect_no_file "$WORK/int"
expect_true "no temporary directory after SIGINT" test -z "$(ls -A "$WORK" | grep '\.int\.tmp')"

# A run killed with SIGKILL leaves its staging directory; the next run to the
# same name removes it (its process is gone) with a notice, and keeps the
# staging of a process that still runs.
sh -c 'exit 0' &
dead=$!
wait "$dead"
mkdir -p "$WORK/stale/.ds.tmp-$dead-0" "$WORK/stale/.ds.tmp-$$-0" "$WORK/stale/.other.tmp-$dead-0"
head -c 4096 /dev/zero >"$WORK/stale/.ds.tmp-$dead-0/train_x.npy"
expect_exit 0 "$G" "$WORK/stale/ds" --train 100 --test 10 --shape 1x4x4
expect_stderr "removed '.*/\.ds\.tmp-$dead-0', staged by process $dead which no longer runs"
expect_no_file "$WORK/stale/.ds.tmp-$dead-0"
expect_file "$WORK/stale/.ds.tmp-$$-0"
expect_file "$WORK/stale/.other.tmp-$dead-0"
expect_file "$WORK/stale/ds/dataset.json"

# One layout spelling for dsgen and dsconvert; the old one still works, with a notice.
expect_exit 0 "$G" "$WORK/v28old" --train 20 --test 5 --shape 1x4x4 --layout feature -q
expect_stderr "--layout feature is deprecated; write --layout feature-major"
expect_file "$WORK/v28old/images_train.bin"
expect_exit 2 "$G" "$WORK/v28bad" --layout column
expect_stderr "invalid --layout 'column' \(expected sample-major or feature-major\)"

# SIGTERM: the same clean-up, exit 143 (128 + 15), as supervisors expect.
"$G" "$WORK/term" --train 20M --test 0 --force -q >/dev/null 2>"$ERR" &
pid=$!
sleep 1
kill -TERM $pid
wait $pid
rc=$?
CHECKS=$((CHECKS + 1))
[ "$rc" -eq 143 ] || fail "SIGTERM exit $rc, expected 143"
expect_stderr "interrupted"
expect_no_file "$WORK/term"
expect_true "no temporary directory after SIGTERM" test -z "$(ls -A "$WORK" | grep '\.term\.tmp')"

finish
