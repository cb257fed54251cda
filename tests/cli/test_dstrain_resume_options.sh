#!/usr/bin/env bash
# dstrain --resume takes the run's options from the checkpoint: `dstrain
# --checkpoint DIR --resume` alone continues the run; options given again must
# match (exit 2 naming the difference), only --epochs may grow; a finished
# run says so and exits 0 (cpu, tiny data).
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"
"$DSGEN" "$WORK/ds" --train 768 --test 200 --shape 1x8x8 --classes 4 --seed 7 -q >/dev/null || { echo "dsgen failed" >&2; exit 1; }

expect_exit 0 "$DSTRAIN" "$WORK/ds" --model small-cnn --device cpu -T 2 --epochs 3 --batch 64 --seed 4 --lr 0.02 \
    --checkpoint "$WORK/ck" --max-steps 20
expect_stdout '^epoch 2/3 \(part\)'
expect_exit 0 "$DSTRAIN" --checkpoint "$WORK/ck" --resume
expect_stderr "--resume: DATASET --model --epochs --batch --lr --device --seed --threads as recorded"
expect_stderr "resumed from .* at epoch 2, batch 8 \(step 20\)"
expect_stdout '^epoch 3/3 '
expect_exit 0 "$DSTRAIN" --checkpoint "$WORK/ck" --resume
expect_stderr "is finished \(3 epochs, 36 steps\); nothing to do"
expect_no_stdout
expect_exit 2 "$DSTRAIN" --checkpoint "$WORK/ck" --resume --batch 32
expect_stderr "options differ: batch 64 -> 32"
expect_exit 2 "$DSTRAIN" --checkpoint "$WORK/ck" --resume --epochs 2
expect_stderr "epochs 3 -> 2"
expect_exit 2 "$DSTRAIN" --checkpoint "$WORK/ck" --resume --model mlp:8
expect_stderr "model conv3x3:16.* -> flatten,fc:8"
expect_exit 0 "$DSTRAIN" "$WORK/ds" --checkpoint "$WORK/ck" --resume --epochs 4 --model small-cnn
expect_stderr "the learning-rate schedule now spans the longer run"
expect_stdout '^epoch 4/4 '
expect_exit 2 "$DSTRAIN" --checkpoint "$WORK/none" --resume
expect_stderr "no DATASET, and no checkpoint in '$WORK/none'"
finish
