#!/usr/bin/env bash
# dstrain checkpoints: SIGINT at a random point exits 130 with a checkpoint,
# kill -9 at a random point leaves a loadable checkpoint, and resuming either
# ends with the same weights, bit for bit, as an uninterrupted run (cpu).
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"
"$DSTRAIN" --help | grep -q -- "--checkpoint" || skip "this dstrain has no --checkpoint (data path not wired in)"

"$DSGEN" "$WORK/ds" --train 4000 --test 500 --shape 1x12x12 --classes 4 --seed 3 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
TRAIN=(--model small-cnn --device cpu --epochs 4 --batch 64 -T 2 --data stream --order chunk --chunk-samples 250
       --window 3 --seed 5 -q)

# The trainer state: the checkpoint file's last state_bytes bytes.
state_of() {
    local file=$1/checkpoint.dstk n
    n=$(grep -ao '"state_bytes": *[0-9]*' "$file" | grep -o '[0-9]*$')
    tail -c "$n" "$file"
}

random_delay() { awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.3 + rand() * 2.0 }'; }

expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/whole"
expect_stdout '^epoch 4/4 '
state_of "$WORK/whole" >"$WORK/whole.state"

# SIGINT mid-run: the step finishes, a checkpoint is written, exit 130.
"$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/int" >"$WORK/int.out" 2>"$WORK/int.err" &
pid=$!
sleep "$(random_delay)"
kill -INT "$pid" 2>/dev/null
wait "$pid"
rc=$?
CHECKS=$((CHECKS + 1))
if [ "$rc" -eq 130 ]; then
    grep -q "checkpoint written" "$WORK/int.err" || fail "no 'checkpoint written' after SIGINT: $(cat "$WORK/int.err")"
    expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/int" --resume
elif [ "$rc" -ne 0 ]; then
    fail "SIGINT run exited $rc (expected 130): $(cat "$WORK/int.err")"
fi
state_of "$WORK/int" >"$WORK/int.state"
expect_same "$WORK/whole.state" "$WORK/int.state"

# kill -9 mid-run, checkpointing every 3 steps: the checkpoint left loads.
"$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/kill" --checkpoint-every 3 >/dev/null 2>&1 &
pid=$!
sleep "$(random_delay)"
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if [ -e "$WORK/kill/checkpoint.dstk" ]; then
    expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/kill" --resume
else
    expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/kill"
fi
state_of "$WORK/kill" >"$WORK/kill.state"
expect_same "$WORK/whole.state" "$WORK/kill.state"
CHECKS=$((CHECKS + 1))
[ -z "$(find "$WORK/kill" -type f ! -name checkpoint.dstk ! -name model.safetensors -newer "$WORK/kill.state" 2>/dev/null)" ] ||
    fail "temporary files left in the checkpoint directory: $(ls -a "$WORK/kill")"

# Usage errors.
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --resume
expect_stderr 'needs --checkpoint'
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/whole"
expect_stderr 'already holds a checkpoint'
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]/#chunk/full}" --checkpoint "$WORK/whole" --resume
expect_stderr 'order chunk -> full'
expect_exit 1 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --checkpoint "$WORK/none" --resume
expect_stderr 'no checkpoint'
finish
