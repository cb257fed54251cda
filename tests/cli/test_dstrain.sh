#!/usr/bin/env bash
# dstrain's engine on the real binary, on the cpu: epoch lines, --json,
# --log-json, usage errors (exit 2), no GPU support (exit 3), divergence
# naming epoch and step (exit 1), and ref-cnn learning dsgen's images.
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"
command -v jq >/dev/null || skip "jq is needed to read the JSON output"

"$DSGEN" "$WORK/img" --train 2000 --test 500 --shape 3x16x16 --classes 10 --seed 5 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
CPU=(--device cpu -T 2 --save "$WORK/model.safetensors" --force)

expect_exit 0 "$DSTRAIN" --help
expect_stdout '--optimizer'
expect_stdout '--precision'

# ref-cnn learns dsgen's images on the cpu in a few epochs (>= 90%).
expect_exit 0 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --model ref-cnn --epochs 3 --batch 64 --log-json "$WORK/log.jsonl"
expect_stdout '^epoch 1/3  loss [0-9.]+  train acc [0-9.]+%  test acc [0-9.]+%  time .* samples/s'
expect_stdout '^epoch 3/3 '
expect_stderr 'model ref-cnn \(conv3x3:32,bn,relu,conv3x3:32'
acc=$(grep -o 'test acc [0-9.]*' "$OUT" | tail -1 | grep -o '[0-9.]*$')
expect_true "ref-cnn test accuracy $acc% >= 90%" awk -v a="$acc" 'BEGIN { exit !(a >= 90) }'
expect_true "--log-json has a memory line and 3 epoch lines" test "$(jq -r .event "$WORK/log.jsonl" | sort | uniq -c |
    tr -s ' ' | tr '\n' ';')" = " 3 epoch; 1 memory;"
expect_true "--log-json memory line: the ceiling and its parts" jq -s -e 'map(select(.event == "memory")) | .[0] |
    .memory_ceiling == .planned_parameters + .planned_activations + .planned_workspace + .planned_data' "$WORK/log.jsonl"
expect_true "--log-json lines are JSON with accuracy" jq -e 'select(.epoch == 3) | .test_accuracy > 0.9' "$WORK/log.jsonl"
expect_true "--log-json epoch lines: the matrix products' rate" jq -e 'select(.event == "epoch") | .matmul_tflops > 0' \
    "$WORK/log.jsonl"

# --json: one document on stdout; epoch lines go to stderr.
expect_exit 0 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --model "conv3x3:8,bn,relu,maxpool2,flatten,fc:10" --epochs 1 \
    --batch 100 --optimizer adamw --schedule constant --label-smoothing 0.1 --json
expect_true "--json document" jq -e '.schema_version == 1 and .device == "cpu" and (.epochs | length) == 1' "$OUT"
# The matrix products' FLOPs per trained sample: 2 x (the first convolution's
# 16x16x8 outputs x 27 forward and weight gradient, the fc's 512 x 10 three times).
expect_true "--json FLOPs and their rate" jq -e '.training_flops_per_sample == 251904 and
    ((.epochs[0].matmul_tflops - .epochs[0].samples_per_second * 251904 / 1e12) | . * . < 1e-18)' "$OUT"
expect_stderr '5,362 parameters, 0.3 MFLOP per trained sample'
expect_stderr '^epoch 1/1'

# Usage errors exit 2 and say what is wrong.
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --model "conv3x3:8,bogus"
expect_stderr "unknown layer 'bogus'"
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --model "flatten,fc:7"
expect_stderr '10 classes'
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --optimizer adam
expect_stderr 'expected sgd or adamw'
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --precision fp16
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --kernels fast
expect_stderr "invalid --kernels .fast. \\(expected auto, cached, retune or heuristic\\)"
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --device gpu
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --batch 5000
expect_stderr 'fewer than --batch'
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --schedule step

# bce learns 0 or 1: refused before training on labels of 10 classes (the
# manifest says so; exit 2), and at the first label above 1 where nothing
# declares the classes (exit 1).
expect_exit 2 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --model small-cnn --loss bce --epochs 1 --batch 100
expect_stderr "label 'y' .*has 10 classes \(0 to 9\) but the loss bce learns targets of 0 or 1; choose ce"
expect_true "nothing trained" bash -c "! grep -q '^epoch' '$OUT'"
cp -r "$WORK/img" "$WORK/noclasses"
python3 -c '
import json, sys
p = sys.argv[1] + "/dataset.json"
m = json.load(open(p))
del m["num_classes"]
json.dump(m, open(p, "w"))
' "$WORK/noclasses"
expect_exit 1 "$DSTRAIN" "$WORK/noclasses" "${CPU[@]}" --model small-cnn --loss bce --epochs 1 --batch 100
expect_stderr "target [2-9] of 'y' \(output 0\) is neither 0 nor 1, as the loss bce needs \(class labels\? choose ce"

# Divergence: exit 1 naming the epoch and the step.
expect_exit 1 "$DSTRAIN" "$WORK/img" "${CPU[@]}" --model "flatten,fc:10" --lr 1e30 --epochs 2 --batch 100
expect_stderr 'non-finite loss at epoch 1, step [0-9]+ of 20'

# A build without CUDA says so with exit 3.
if ! "$DSTRAIN" --version 2>&1 | grep -qi cuda && ! ldd "$DSTRAIN" 2>/dev/null | grep -q libcudart; then
    expect_exit 3 "$DSTRAIN" "$WORK/img" --device cuda:0 --epochs 1
    expect_stderr 'built without CUDA support'
fi
finish
