#!/usr/bin/env bash
# dstrain on a mix of datasets (cpu, tiny data): the plan one line per member,
# the per-member shares, the dataset field as a target and a side input, a
# mix.json, resume equal to the uninterrupted run (batch order and weights),
# a resume with changed weights and with an added member saying what
# changed, and the usage errors (exit 2) naming what to fix.
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
DSCONVERT="$BIN/dsconvert"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"
command -v jq >/dev/null || skip "jq is needed to read --log-json"

for i in 0 1 2; do
    "$DSGEN" "$WORK/s$i" --train $((600 + i * 300)) --test 100 --shape 1x8x8 --classes 4 --seed $i -q >/dev/null ||
        { echo "dsgen failed" >&2; exit 1; }
done
"$DSGEN" "$WORK/other" --train 500 --test 100 --shape 1x6x6 --classes 4 -q >/dev/null || exit 1
O=(--device cpu --batch 32 -T 2 --chunk-samples 100 --window 2 --seed 5)
T=(--model "conv3x3:8,relu,maxpool2,flatten,fc:4" "${O[@]}")

# A mix trains; the plan names each member's placement; the shares follow the weights.
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "$WORK/s2" --weights 2,1,1 --placement device,host,stream "${T[@]}" \
    --epochs 2 --save "$WORK/m.safetensors"
expect_stdout '^epoch 2/2 '
expect_stderr "mix: 0 $WORK/s0 \(600 samples, 50\.0% of draws\): device"
expect_stderr "mix: 1 $WORK/s1 \(900 samples, 25\.0% of draws\): host"
expect_stderr "mix: 2 $WORK/s2 \(1,200 samples, 25\.0% of draws\): stream"
expect_stderr 'mix: 1,200 samples per epoch, 37 batches of 32; host ceiling'
expect_stderr 'mix samples this epoch: .*s0 50\.00% \(planned 50\.00%\)'
expect_stderr '1,200 train samples per epoch / 300 test samples over 3 datasets'

# Default weights: the sizes, every sample once.
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "${T[@]}" --epochs 1 -q --save "$WORK/d.safetensors"
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "${T[@]}" --epochs 1 --save "$WORK/d.safetensors" --force
expect_stderr 'mix: 1,500 samples per epoch'

# The dataset field as a second head's target and as a side input.
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "$WORK/s2" "${O[@]}" --epochs 1 --save "$WORK/h.safetensors" \
    --model "conv3x3:8,relu,maxpool2,flatten,heads(cls=fc:4>ce:y, which=fc:3>ce:dataset)"
expect_stdout '\[which: acc [0-9.]+% \| test acc [0-9.]+%\]'
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "${O[@]}" --epochs 1 --save "$WORK/side.safetensors" \
    --model "conv3x3:8,relu,maxpool2,flatten,side,fc:4" --side-input dataset
expect_stdout '^epoch 1/1 '

# mix.json: paths relative to its folder, weights and placements.
mkdir -p "$WORK/mixdir"
printf '{"members": [{"path": "../s0", "weight": 2, "placement": "device"}, {"path": "../s1", "weight": 1}, {"path": "%s", "weight": 1}]}\n' \
    "$WORK/s2" >"$WORK/mixdir/mix.json"
expect_exit 0 "$DSTRAIN" "$WORK/mixdir/mix.json" "${T[@]}" --epochs 1 --save "$WORK/j.safetensors"
expect_stderr 'mix: 0 .*s0 \(600 samples, 50\.0% of draws\): device'
expect_stderr 'mix: 2 .*s2 \(1,200 samples, 25\.0% of draws\)'

# Resume mid-epoch equals the uninterrupted run: the same batches (index and
# batch hashes) and the same weights, bit for bit.
R=("$WORK/s0" "$WORK/s1" "$WORK/s2" --weights 3,1,2 --placement device,stream,host "${T[@]}" --epochs 2 -q)
expect_exit 0 "$DSTRAIN" "${R[@]}" --log-json "$WORK/whole.json" --save "$WORK/whole.safetensors"
expect_exit 0 "$DSTRAIN" "${R[@]}" --log-json "$WORK/part.json" --save "$WORK/part.safetensors" \
    --checkpoint "$WORK/ck" --max-steps 13
expect_exit 0 "$DSTRAIN" "${R[@]}" --log-json "$WORK/part.json" --save "$WORK/part.safetensors" \
    --checkpoint "$WORK/ck" --resume --force
hashes() { jq -r 'select(.event == "epoch") | .index_hashes[]' "$1"; }
expect_true "resumed run: the same batches" test "$(hashes "$WORK/whole.json")" = "$(hashes "$WORK/part.json")"
expect_true "resumed run: batches hashed" test "$(hashes "$WORK/whole.json" | wc -l)" -gt 60
expect_same "$WORK/whole.safetensors" "$WORK/part.safetensors"
whole_hash=$(jq -r 'select(.event == "epoch") | .stages.batch_hash' "$WORK/whole.json" | tail -1)
part_hash=$(jq -r 'select(.event == "epoch") | .stages.batch_hash' "$WORK/part.json" | tail -1)
expect_true "the last epoch's batch contents agree" test "$whole_hash" = "$part_hash"
expect_true "the batch contents are hashed" test "$(jq -r 'select(.event == "epoch") | .stages.batch_hash | type' \
    "$WORK/whole.json" | sort -u)" = number

# A resume with other weights, and with an added member, says what changed.
C=("${T[@]}" --epochs 2)
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "${C[@]}" -q --checkpoint "$WORK/ckw" --max-steps 10 \
    --save "$WORK/w.safetensors"
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" --weights 1,3 "${C[@]}" --checkpoint "$WORK/ckw" --resume \
    --save "$WORK/w.safetensors" --force
expect_stderr "mix: $WORK/s0 weight 1 \(was 600\)"
expect_stderr "mix: $WORK/s1 weight 3 \(was 900\)"
expect_stderr 'mix changed since the checkpoint'
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "${C[@]}" -q --checkpoint "$WORK/cka" --max-steps 10 \
    --save "$WORK/a.safetensors"
expect_exit 0 "$DSTRAIN" "$WORK/s0" "$WORK/s1" "$WORK/s2" "${C[@]}" --checkpoint "$WORK/cka" --resume \
    --save "$WORK/a.safetensors" --force
expect_stderr "mix: $WORK/s2 added \(weight 1200\)"
expect_stderr "mix: $WORK/s0 unchanged"

# Usage errors, exit 2.
expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/s1" --weights 1,2,3 "${T[@]}"
expect_stderr '--weights lists 3 weights for 2 datasets'
expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/s1" --weights 1,-2 "${T[@]}"
for w in 1,nan 1,0 1,inf; do
    expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/s1" --weights "$w" "${T[@]}"
    expect_stderr "--weights: '${w#1,}' is not a weight \(weights must be positive finite numbers"
done
expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/other" "${T[@]}"
expect_stderr "member 1 \($WORK/other\) holds field 'x' as u8\[1x6x6\] but member 0"
expect_exit 2 "$DSTRAIN" "$WORK/s0" --weights 2 "${T[@]}"
expect_stderr '--weights applies to a mix of datasets'
expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/s1" --placement device,host,stream "${T[@]}"
expect_stderr '--placement lists 3 placements for 2 datasets'
expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/s1" --placement gpu "${T[@]}"
expect_stderr "invalid --placement 'gpu'"
expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/s1" --data stream "${T[@]}"
expect_stderr '--data stream with a mix of datasets'
expect_exit 2 "$DSTRAIN" "$WORK/s0" "$WORK/s0" "${T[@]}"
expect_stderr 'is in the mix twice'
printf '{"members": [{"path": "../s0"}, {"weight": 2}]}' >"$WORK/mixdir/bad.json"
expect_exit 2 "$DSTRAIN" "$WORK/mixdir/bad.json" "${T[@]}"
expect_stderr 'bad.json: member 1 has no "path"'
printf '{"members": [' >"$WORK/mixdir/broken.json"
expect_exit 2 "$DSTRAIN" "$WORK/mixdir/broken.json" "${T[@]}"
expect_stderr 'broken.json: not valid JSON'
printf '{"members": [{"path": "../s0", "weight": 1}, {"path": "../s1"}]}' >"$WORK/mixdir/some.json"
expect_exit 2 "$DSTRAIN" "$WORK/mixdir/some.json" "${T[@]}"
expect_stderr '1 of 2 members have a weight \(all or none\)'
printf '{"members": [{"path": "../s0", "wieght": 1}]}' >"$WORK/mixdir/typo.json"
expect_exit 2 "$DSTRAIN" "$WORK/mixdir/typo.json" "${T[@]}"
expect_stderr 'unknown key "wieght" \(known: path, weight, placement\)'

# A field missing from one member: the side input only s0x holds.
if [ -x "$DSCONVERT" ] && PY=$(numpy_python) && [ -n "$PY" ]; then
    (cd "$WORK" && "$PY" -c '
import numpy as np
r = np.random.default_rng(1)
for name, extra in (("a", True), ("b", False)):
    d = {"x_train": r.integers(0, 255, (200, 1, 8, 8), dtype=np.uint8), "y_train": r.integers(0, 4, 200).astype(np.int32)}
    if extra: d["aux_train"] = r.normal(size=(200, 3)).astype(np.float32)
    np.savez(name + ".npz", **d)
') || exit 1
    "$DSCONVERT" "$WORK/a.npz" "$WORK/a" --x-array x --y-array y -q && "$DSCONVERT" "$WORK/b.npz" "$WORK/b" --x-array x \
        --y-array y -q || { echo "dsconvert failed" >&2; exit 1; }
    expect_exit 2 "$DSTRAIN" "$WORK/a" "$WORK/b" "${O[@]}" --model "conv3x3:8,relu,maxpool2,flatten,side,fc:4" \
        --side-input aux
    expect_stderr "member 1 \($WORK/b\) has no field 'aux'"
fi
finish
