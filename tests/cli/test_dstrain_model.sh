#!/usr/bin/env bash
# dstrain's model files: every run ends by writing the model (--save, or
# model.safetensors in --checkpoint DIR / beside --log-json / in the current
# directory), never over an existing file without --force; dstrain eval and
# predict read it; --init-from starts a run from it (cpu, tiny data).
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"

"$DSGEN" "$WORK/ds" --train 768 --test 200 --shape 1x8x8 --classes 4 --seed 7 -q >/dev/null || { echo "dsgen failed" >&2; exit 1; }
"$DSGEN" "$WORK/ds3" --train 256 --test 64 --shape 3x8x8 --classes 4 --seed 7 -q >/dev/null || { echo "dsgen failed" >&2; exit 1; }
TRAIN=(--model small-cnn --device cpu -T 2 --batch 64)
CPU=(--device cpu -T 2)

# Default places: the checkpoint directory, beside --log-json, the current directory.
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --epochs 2 --checkpoint "$WORK/ck"
expect_file "$WORK/ck/model.safetensors"
expect_stderr "model saved to $WORK/ck/model.safetensors"
test_acc=$(grep -o 'test acc [0-9.]*%' "$OUT" | tail -1 | grep -o '[0-9.]*%')
mkdir -p "$WORK/logs"
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --log-json "$WORK/logs/run.jsonl" -q
expect_file "$WORK/logs/model.safetensors"
(cd "$WORK" && "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" -q >/dev/null 2>&1)
expect_file "$WORK/model.safetensors"
# Where the default file exists: the first free model-N.safetensors, with a note.
CHECKS=$((CHECKS + 1))
(cd "$WORK" && "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" >/dev/null 2>"$ERR") || fail "a second run in the same directory failed"
expect_stderr "model.safetensors exists: this run's model goes to model-2.safetensors"
expect_file "$WORK/model-2.safetensors"

# Never over an existing file without --force; only known extensions; never over a directory.
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --save "$WORK/model.safetensors"
expect_stderr "exists .*--force"
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --save "$WORK/model.safetensors" --force -q
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --save "$WORK/model.bin"
expect_stderr "unknown extension"
mkdir "$WORK/dir.safetensors"
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --save "$WORK/dir.safetensors" --force
expect_stderr "not a regular file"

# safetensors layout: u64 header length, then a JSON header with the PyTorch names.
expect_true "safetensors header names 0.weight" grep -aq '"0.weight":{"dtype":"F32","shape":\[16,1,3,3\]' \
    "$WORK/ck/model.safetensors"
expect_true "metadata holds the spec" grep -aq '"model":"conv3x3:16,bn,relu,maxpool2' "$WORK/ck/model.safetensors"

# ONNX beside it: a ModelProto (field 1, ir_version 7).
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --save "$WORK/m.onnx" --save "$WORK/m.safetensors" -q
expect_true "ONNX starts with ir_version 7" test "$(head -c 2 "$WORK/m.onnx" | od -An -tx1 | tr -d ' ')" = 0807

# eval: the accuracy training reported on the same split, per class, confusion matrix.
expect_exit 0 "$DSTRAIN" eval "$WORK/ds" --weights "$WORK/ck/model.safetensors" "${CPU[@]}"
expect_stdout "accuracy $test_acc"
expect_stdout "^class  samples  accuracy"
expect_stdout "confusion matrix"
expect_exit 0 "$DSTRAIN" eval "$WORK/ds" --weights "$WORK/ck/model.safetensors" "${CPU[@]}" --json
expect_true "eval --json: 4 classes, confusion sums to 200" \
    test "$(jq -r '"\(.per_class | length),\([.confusion[][]] | add),\(.samples)"' "$OUT")" = "4,200,200"
expect_exit 0 "$DSTRAIN" eval "$WORK/ds" --weights "$WORK/ck/model.safetensors" "${CPU[@]}" --split train -q
expect_stdout "768 samples"
expect_exit 2 "$DSTRAIN" eval "$WORK/ds3" --weights "$WORK/ck/model.safetensors" "${CPU[@]}"
expect_stderr "holds samples of 3x8x8 but the model takes 1x8x8"
expect_exit 1 "$DSTRAIN" eval "$WORK/ds" --weights "$WORK/none.safetensors" "${CPU[@]}"
expect_stderr "cannot open model"
head -c 100 "$WORK/ck/model.safetensors" >"$WORK/cut.safetensors"
expect_exit 1 "$DSTRAIN" eval "$WORK/ds" --weights "$WORK/cut.safetensors" "${CPU[@]}"
expect_stderr "not a safetensors file, or damaged"
expect_exit 2 "$DSTRAIN" eval "$WORK/ds"
expect_stderr "weights is required"

# predict: JSON lines on stdout, or a .npy of probabilities; never over a file without --force.
expect_exit 0 "$DSTRAIN" predict "$WORK/ds" --weights "$WORK/ck/model.safetensors" "${CPU[@]}" -q
expect_true "200 JSON lines" test "$(wc -l <"$OUT")" -eq 200
expect_true "each line has index, class, 4 probabilities" \
    test "$(jq -c '[.index, (.class | type), (.probabilities | length)]' "$OUT" | sort -u | wc -l)" -eq 200
expect_exit 0 "$DSTRAIN" predict "$WORK/ds" --weights "$WORK/ck/model.safetensors" "${CPU[@]}" -o "$WORK/p.npy"
expect_stderr "predicted 200 samples into $WORK/p.npy"
expect_true "p.npy: f4, (200, 4)" grep -aq "'descr': '<f4', 'fortran_order': False, 'shape': (200, 4)" "$WORK/p.npy"
expect_exit 2 "$DSTRAIN" predict "$WORK/ds" --weights "$WORK/ck/model.safetensors" "${CPU[@]}" -o "$WORK/p.npy"
expect_exit 0 "$DSTRAIN" predict "$WORK/ds" --weights "$WORK/ck/model.safetensors" "${CPU[@]}" -o "$WORK/p.npy" -f
expect_exit 0 "$DSTRAIN" predict "$WORK/ds/test_x.npy" --weights "$WORK/ck/model.safetensors" "${CPU[@]}" -q
expect_true "a .npy input gives 200 lines" test "$(wc -l <"$OUT")" -eq 200
CHECKS=$((CHECKS + 1))
"$DSTRAIN" predict - --weights "$WORK/ck/model.safetensors" "${CPU[@]}" -q <"$WORK/ds/test_x.npy" >"$WORK/stdin.jsonl" ||
    fail "predict from stdin failed"
expect_same "$WORK/stdin.jsonl" "$OUT"
expect_exit 2 "$DSTRAIN" predict "$WORK/ds3/test_x.npy" --weights "$WORK/ck/model.safetensors" "${CPU[@]}"
expect_stderr "model takes 1x8x8"
expect_exit 2 "$DSTRAIN" predict "$WORK/ds/dataset.json" --weights "$WORK/ck/model.safetensors" "${CPU[@]}"
expect_stderr "expected a dataset directory, a .npy file"

# --init-from: the same network continues from the saved weights; another one is refused.
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${TRAIN[@]}" --epochs 1 --init-from "$WORK/ck/model.safetensors" \
    --save "$WORK/tuned.safetensors"
first=$(grep -o 'train acc [0-9.]*' "$OUT" | grep -o '[0-9.]*$')
expect_true "training from the saved model starts above chance ($first%)" awk -v a="$first" 'BEGIN { exit !(a > 60) }'
expect_exit 2 "$DSTRAIN" "$WORK/ds" --model mlp:16 "${CPU[@]}" --init-from "$WORK/ck/model.safetensors" \
    --save "$WORK/x.safetensors"
expect_stderr "holds another network \(model conv3x3:16"
expect_no_file "$WORK/x.safetensors"

# Progress inside an epoch: with --progress (stderr is no terminal here), never without.
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${CPU[@]}" --model small-cnn --epochs 1 --batch 8 --save "$WORK/p.safetensors" --progress
expect_stderr "epoch 1/1: +[0-9.]+%  [0-9]+/96 steps  ETA [^ ]+( [a-z]+)?  [0-9,]+ samples/s  read wait [0-9.]+%"
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${CPU[@]}" --model small-cnn --epochs 1 --batch 8 --save "$WORK/p.safetensors" --force
CHECKS=$((CHECKS + 1))
! grep -q "steps  ETA" "$ERR" || fail "a progress line although stderr is not a terminal"

# The man page's EXAMPLES and the README's lines, as written (on the CPU where there is no GPU).
mkdir "$WORK/ex"
ln -s "$WORK/ds" "$WORK/ex/data"
cp "$WORK/ds/test_x.npy" "$WORK/ex/samples.npy"
CHECKS=$((CHECKS + 1))
(
    cd "$WORK/ex" && set -e
    "$DSTRAIN" data/ --checkpoint ck/ --save ck/model.onnx --save ck/model.safetensors --epochs 1 -q >/dev/null
    "$DSTRAIN" eval data/ --weights ck/model.safetensors >/dev/null
    "$DSTRAIN" predict samples.npy --weights ck/model.safetensors -o probs.npy -q
    "$DSTRAIN" data/ --init-from ck/model.safetensors --epochs 2 --lr 0.01 --save tuned.safetensors -q >/dev/null
    "$DSTRAIN" --checkpoint ck/ --resume -q
    "$DSTRAIN" data/ --save model.safetensors --save model.onnx -q >/dev/null
) 2>"$ERR" || fail "a man page or README example failed"
expect_file "$WORK/ex/model.onnx"
expect_file "$WORK/ex/ck/model.onnx"
expect_file "$WORK/ex/probs.npy"
expect_file "$WORK/ex/tuned.safetensors"
finish
