#!/usr/bin/env bash
# dstrain's data path on the cpu: every placement and order trains, reports
# its placement, ceiling and per-stage times, and bad data options fail
# clearly; a file that shrinks mid-run is an error naming it (exit 1).
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"
"$DSTRAIN" --help | grep -q -- "--order" || skip "this dstrain has no --order (data path not wired in)"

"$DSGEN" "$WORK/ds" --train 3000 --test 500 --shape 1x12x12 --classes 4 --seed 3 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
BASE=(--model small-cnn --device cpu -T 2 --seed 1 --save "$WORK/model.safetensors" --force)
E2=(--epochs 2 --batch 50)

for placement in stream device; do
    for order in sequential chunk full; do
        expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" "${E2[@]}" --data "$placement" --order "$order" --log-json "$WORK/log"
        expect_stdout '^epoch 2/2 .*test acc [0-9.]+%.*\[read wait .*compute .*; limited by (compute|read \(disk\)|decode \(zstd\)|h2d \(host to device\))\]'
        expect_stderr "data $placement .*order $order"
        expect_stderr 'memory ceiling'
        expect_true "--log-json has the stages" grep -q '"stages"' "$WORK/log"
        expect_true "--log-json names the limiting stage" grep -q '"limited_by":"' "$WORK/log"
    done
done
# Learnable data: two epochs reach high test accuracy through the stream path.
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" "${E2[@]}" --data stream --order chunk --chunk-samples 100 --window 4
acc=$(grep -o 'test acc [0-9.]*' "$OUT" | tail -1 | grep -o '[0-9.]*$')
expect_true "test accuracy $acc% >= 90%" awk -v a="$acc" 'BEGIN { exit !(a >= 90) }'

expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" "${E2[@]}" --data auto
expect_stderr 'data device \(the splits .* fit in'
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --eval-every 20 --epochs 1 --batch 50
expect_stderr '^step 20  test loss'

expect_exit 2 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" "${E2[@]}" --data managed
expect_stderr 'managed needs a CUDA device'
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" "${E2[@]}" --order random
expect_stderr "invalid --order 'random'"
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" "${E2[@]}" --data somewhere
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --batch 5000
expect_stderr 'fewer than --batch'
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" "${E2[@]}" --prefetch 0

# A training file cut short before the run: Dataset::open names it.
cp -r "$WORK/ds" "$WORK/cut"
truncate -s 100000 "$WORK/cut/train_x.npy"
expect_exit 1 "$DSTRAIN" "$WORK/cut" "${BASE[@]}" "${E2[@]}" --data stream
expect_stderr 'train_x.npy'
finish
