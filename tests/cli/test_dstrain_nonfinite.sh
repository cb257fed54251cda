#!/usr/bin/env bash
# Non-finite inputs are bad data (exit 1, the sample and field named) even
# when the manifest carries per-channel statistics, as dsgen writes them: the
# statistics were computed before the values went bad, so they are finite.
#
# A run that diverges in its last epoch (the update after its last step
# leaves the weights NaN while every training loss was finite) fails with
# exit 1 and saves no model; a model whose weights are NaN is no model to
# evaluate; a NaN output is never a right prediction.
source "$(dirname "$0")/lib.sh"
G="$BIN/dsgen"
T="$BIN/dstrain"
[ -x "$G" ] && [ -x "$T" ] || skip "no dsgen/dstrain binary in $BIN"

"$G" "$WORK/ds" --train 400 --test 100 --shape 1x8x8 -q
DIV=("$WORK/ds" --device cpu -T 1 --model small-cnn --batch 32 --lr 1e30 --epochs 1)
# Stopped after 2 steps, both losses finite (1e29): the weights the second
# update left are NaN, and the test split's outputs with them (before: exit 0,
# "test acc 100.00%", a model of NaN saved).
expect_exit 1 "$T" "${DIV[@]}" --max-steps 2 --save "$WORK/m.safetensors"
expect_stderr "non-finite (weights|test loss).* after epoch 1, step 2 of 12 \(training diverged"
expect_stderr "lower --lr"
expect_true "no epoch line reports the diverged model" bash -c "! grep -q 'test acc' '$OUT'"
expect_no_file "$WORK/m.safetensors"
expect_true "no temporary model left" test -z "$(find "$WORK" -maxdepth 1 -name '.m.safetensors*')"
# --checkpoint-every 1: step 1's checkpoint is kept; none holds the diverged weights.
expect_exit 1 "$T" "${DIV[@]}" --max-steps 2 --checkpoint "$WORK/ck" --checkpoint-every 1
expect_stderr "non-finite weights after epoch 1, step 2 of 12 .*the last checkpoint is kept"
expect_no_file "$WORK/ck/model.safetensors"
cp "$WORK/ck/checkpoint.dstk" "$WORK/step1.dstk"
expect_exit 1 "$T" --checkpoint "$WORK/ck" --resume --max-steps 2 -q
expect_stderr "non-finite weights after epoch 1, step 2 of 12"
expect_same "$WORK/ck/checkpoint.dstk" "$WORK/step1.dstk"
# Found at an evaluation inside the epoch (--eval-every): the same failure.
expect_exit 1 "$T" "${DIV[@]}" --max-steps 3 --eval-every 2 --save "$WORK/m.safetensors"
expect_stderr "non-finite test loss \((-?nan|inf)\) after epoch 1, step 2 of 12"
expect_no_file "$WORK/m.safetensors"

# dstrain eval and --init-from refuse a model holding NaN (written here into
# the first element of the model's first f32 tensor).
expect_exit 0 "$T" "$WORK/ds" --device cpu -T 1 --model small-cnn --epochs 1 --batch 32 --save "$WORK/ok.safetensors" -q
expect_exit 0 "$T" eval "$WORK/ds" --weights "$WORK/ok.safetensors" --device cpu
expect_stdout "accuracy"
cp "$WORK/ok.safetensors" "$WORK/nan.safetensors"
python3 -c '
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    name = min(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    f.seek(8 + n + header[name]["data_offsets"][0])
    f.write(struct.pack("<f", float("nan")))
' "$WORK/nan.safetensors"
expect_exit 1 "$T" eval "$WORK/ds" --weights "$WORK/nan.safetensors" --device cpu
expect_stderr "nan.safetensors: tensor '.*' holds NaN or Inf values"
expect_no_stdout
expect_exit 1 "$T" "$WORK/ds" --device cpu -T 1 --model small-cnn --epochs 1 --batch 32 --init-from "$WORK/nan.safetensors" --save "$WORK/x.safetensors"
expect_stderr "holds NaN or Inf values"
expect_no_file "$WORK/x.safetensors"

PY=$(numpy_python)
if [ -z "$PY" ]; then
    echo "numpy is needed to write NaN into a dataset: its checks are left out" >&2
    finish
fi

"$G" "$WORK/nan" --train 256 --test 16 --shape 3x4x4 --dtype f32 --classes 2 -q
expect_true "dsgen writes channel statistics" grep -q '"stats"' "$WORK/nan/dataset.json"
"$PY" -c '
import sys
import numpy as np
a = np.load(sys.argv[1] + "/train_x.npy", mmap_mode="r+")
a[37, 1, 2, 3] = np.nan
a[200, 0, 0, 0] = np.inf
a.flush()
' "$WORK/nan"
expect_exit 1 "$T" "$WORK/nan" --device cpu -T 1 --model mlp:8 --epochs 1 --batch 16
expect_stderr "field 'x' sample 37 holds a non-finite value \(NaN at element 27"

# Inf alone, past the first bad sample, is named too.
"$PY" -c '
import sys
import numpy as np
a = np.load(sys.argv[1] + "/train_x.npy", mmap_mode="r+")
a[37, 1, 2, 3] = 0.5
a.flush()
' "$WORK/nan"
expect_exit 1 "$T" "$WORK/nan" --device cpu -T 1 --model mlp:8 --epochs 1 --batch 16
expect_stderr "field 'x' sample 200 holds a non-finite value \(Inf at element 0"
finish
