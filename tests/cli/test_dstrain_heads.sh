#!/usr/bin/env bash
# dstrain beyond class labels, on the real binaries (cpu, tiny data): a float
# target with each loss and the default printed, a side input, two heads on
# one trunk (chess-shaped), per-head figures in the epoch lines, --log-json and
# --json, errors that name the fix, dstrain eval's metrics and its
# confusion-matrix limit, predict writing every head, --init-from, resume.
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSCONVERT="$BIN/dsconvert"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSCONVERT" ] || skip "no dsconvert binary in $BIN"
command -v jq >/dev/null || skip "jq is needed to read the JSON output"
PY=$(numpy_python)
[ -n "$PY" ] || skip "numpy is needed for the .npz fixtures"

# neuro.npz: stimuli, 12 neurons' spike counts (f32) whose rates follow the
# stimulus, a 4-value behaviour; chess.npz: 12 planes, the move (the square of
# the piece on plane 0, 64 classes) and the result (i8 in -1..1).
(cd "$WORK" && "$PY" -c '
import numpy as np
r = np.random.default_rng(3)
def neuro(n):
    stim = r.normal(size=(n, 1, 6, 6)).astype(np.float32)
    behavior = r.normal(size=(n, 4)).astype(np.float32)
    w = np.random.default_rng(9).normal(size=(36, 12)) / 6
    rates = np.log1p(np.exp(stim.reshape(n, 36) @ w + 0.3 * behavior[:, :1]))
    return stim, r.poisson(rates).astype(np.float32), behavior
s, y, b = neuro(512); st, yt, bt = neuro(128)
np.savez("neuro.npz", stim_train=s, robs_train=y, behavior_train=b, stim_test=st, robs_test=yt, behavior_test=bt)
def chess(n):
    pos = (r.random((n, 12, 8, 8)) < 0.06).astype(np.float32)
    moves = r.integers(0, 64, n).astype(np.int32)
    pos[:, 0] = 0
    pos[np.arange(n), 0, moves // 8, moves % 8] = 1
    results = np.sign(pos[:, 1].sum((1, 2)) - pos[:, 7].sum((1, 2))).astype(np.int8)
    return pos, moves, results
p, m, res = chess(512); pt, mt, rt = chess(128)
np.savez("chess.npz", positions_train=p, moves_train=m, results_train=res,
         positions_test=pt, moves_test=mt, results_test=rt)
np.save("stim.npy", st[:10]); np.save("behavior.npy", bt[:10]); np.save("positions.npy", pt[:10])
') || { echo "numpy fixtures failed" >&2; exit 1; }
"$DSCONVERT" "$WORK/neuro.npz" "$WORK/neuro" --x-array stim --y-array robs -q || { echo "dsconvert neuro failed" >&2; exit 1; }
"$DSCONVERT" "$WORK/chess.npz" "$WORK/chess" --x-array positions --y-array moves --num-classes 64 -q ||
    { echo "dsconvert chess failed" >&2; exit 1; }
CPU=(--device cpu -T 2 --batch 64 --force)
# The fields' names as dsconvert gave them (the roles' names, or the arrays' own).
ROBS=$(jq -r .label_field "$WORK/neuro/dataset.json")
MOVES=$(jq -r .label_field "$WORK/chess/dataset.json")

# A float target: mse by default, said so; each loss trains and reports its figures.
expect_exit 0 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --epochs 1 --save "$WORK/mse.safetensors"
expect_stderr "loss mse on '$ROBS' \(f32 12, 12 outputs; the default for this dtype and shape, --loss sets another\)"
expect_stdout '^epoch 1/1  loss [0-9.]+  test loss [0-9.]+  \[r2 [-0-9.]+  r [-0-9.]+ \| test r2 [-0-9.]+  r [-0-9.]+\]  time'
for loss in poisson poisson-exp; do
    expect_exit 0 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --epochs 20 --loss $loss --lr 0.01 \
        --optimizer adamw --save "$WORK/$loss.safetensors"
    expect_stderr "loss $loss on '$ROBS'"
    expect_stdout "^epoch 20/20  loss [0-9.]+  test loss [0-9.]+  \[explained [-0-9.]+  r [-0-9.]+ \| test explained"
done
ex=$(grep -o 'test explained [-0-9.]*' "$OUT" | tail -1 | grep -o '[-0-9.]*$')
expect_true "the Poisson model explains some deviance ($ex)" awk -v a="$ex" 'BEGIN { exit !(a > 0.05) }'

# A side input: normalised and joined before the last fc, printed, in the spec.
expect_exit 0 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --epochs 1 --loss poisson --side-input behavior \
    --save "$WORK/side.safetensors" --log-json "$WORK/side.jsonl"
expect_stderr "side input 'behavior' \(f32, 4 values per sample\)"
expect_stderr "model mlp:16 \(flatten,fc:16,relu,side,fc:12\)"
expect_true "--log-json: one head, its figures train and test" \
    jq -s -e 'map(select(.event == "epoch"))[0].heads[0] | .loss_kind == "poisson" and (.train | has("explained")) and
        (.test | has("pearson"))' "$WORK/side.jsonl"

# Errors that name the fix.
expect_exit 2 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --loss ce
expect_stderr "does not fit the loss ce .*choose mse \(regression\), poisson or poisson-exp \(counts\) or bce"
expect_exit 2 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --loss huber
expect_stderr "invalid --loss 'huber' \(expected ce, mse, poisson, poisson-exp or bce\)"
expect_exit 2 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --label spikes
expect_stderr "label 'spikes' is not a field of the data \(fields: .*behavior"
expect_exit 2 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --side-input pupil
expect_stderr "side input 'pupil' is not a field"
expect_exit 2 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model "flatten,fc:5"
expect_stderr "its target '$ROBS' has 12 values per sample \(end with 'fc:12'\)"
expect_exit 2 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model "flatten,side,fc:12"
expect_stderr "no side input field is given"

# Two heads on one trunk: each head's figures per epoch, in --json too.
HEADS="conv3x3:8,relu,flatten,fc:32,relu,heads(policy=fc:64>ce:$MOVES, value=fc:8,relu,fc:1,tanh>mse:results*0.5)"
expect_exit 0 "$DSTRAIN" "$WORK/chess" "${CPU[@]}" --model "$HEADS" --epochs 15 --optimizer adamw --lr 0.003 \
    --save "$WORK/chess.safetensors" --save "$WORK/chess.onnx" --json
expect_stderr "head policy: loss ce on '$MOVES' \(i32, 64 classes\)"
expect_stderr "head value: loss mse on 'results' \(i8, 1 outputs\), weight 0.500"
expect_stderr "^epoch 15/15  loss [0-9.]+  test loss [0-9.]+  \[policy: acc [0-9.]+%  top-5 [0-9.]+% \| test acc"
expect_stderr "\] +\[value: r2 [-0-9.]+  r [-0-9.]+ \| test r2"
expect_true "--json: both heads' figures per epoch" jq -e '.epochs[14].heads | map(.name) == ["policy", "value"] and
    (.[0].test | has("top5_accuracy")) and (.[1].train | has("r2"))' "$OUT"
acc=$(jq -r '.epochs[14].heads[0].test.accuracy' "$OUT")
expect_true "the policy head learns the move ($acc)" awk -v a="$acc" 'BEGIN { exit !(a > 0.5) }'
expect_true "safetensors names: heads.policy.0.weight [64, 32]" \
    grep -aq '"heads.policy.0.weight":{"dtype":"F32","shape":\[64,32\]' "$WORK/chess.safetensors"
expect_true "metadata: format version 2" grep -aq '"format_version":"2"' "$WORK/chess.safetensors"
expect_exit 2 "$DSTRAIN" "$WORK/chess" "${CPU[@]}" --model "$HEADS" --loss mse
expect_stderr "give each head its loss there"
expect_exit 2 "$DSTRAIN" "$WORK/chess" "${CPU[@]}" --model "flatten,heads(a=fc:64>ce:$MOVES, b=fc:1>mse:score)"
expect_stderr "head 'b' target 'score' is not a field of the data \(fields: .*results\)"
expect_exit 2 "$DSTRAIN" "$WORK/chess" "${CPU[@]}" --model "flatten,heads(a=fc:64>ce:$MOVES, b=fc:1>results"
expect_stderr "model spec: heads\( is not closed"

# eval: every head's figures; the confusion matrix of 64 classes only when asked.
expect_exit 0 "$DSTRAIN" eval "$WORK/chess" --weights "$WORK/chess.safetensors" --device cpu -T 2
expect_stdout "^head policy \(ce on '$MOVES', 64 classes\):  loss [0-9.]+  acc [0-9.]+%  top-5 [0-9.]+%"
expect_stdout "^head value \(mse on 'results', 1 outputs\):  loss [0-9.]+  r2 [-0-9.]+  r [-0-9.]+"
expect_stdout "left out above 50 classes; --confusion prints them"
CHECKS=$((CHECKS + 1))
! grep -q "^confusion matrix" "$OUT" || fail "a confusion matrix of 64 classes without --confusion"
expect_exit 0 "$DSTRAIN" eval "$WORK/chess" --weights "$WORK/chess.safetensors" --device cpu -T 2 --confusion
expect_stdout "^confusion matrix"
expect_exit 0 "$DSTRAIN" eval "$WORK/chess" --weights "$WORK/chess.safetensors" --device cpu -T 2 --json
expect_true "eval --json: heads, no confusion matrix" jq -e '(.heads | length) == 2 and .samples == 128 and
    (.heads[0] | has("confusion") | not) and (.heads[1] | has("r2"))' "$OUT"
expect_exit 0 "$DSTRAIN" eval "$WORK/neuro" --weights "$WORK/poisson.safetensors" --device cpu -T 2
expect_stdout "^head \(poisson on '$ROBS', 12 outputs\):  loss [0-9.]+  explained [-0-9.]+  r [-0-9.]+"

# predict: every head, as JSON lines or one .npy per head.
expect_exit 0 "$DSTRAIN" predict "$WORK/chess" --weights "$WORK/chess.safetensors" --device cpu -q
expect_true "128 JSON lines, a class and 64 probabilities, one value" test "$(jq -c \
    '[(.policy.class | type), (.policy.probabilities | length), (.value.values | length)]' "$OUT" | sort -u)" = \
    '["number",64,1]'
expect_exit 0 "$DSTRAIN" predict "$WORK/positions.npy" --weights "$WORK/chess.safetensors" --device cpu \
    -o "$WORK/p.npy"
expect_true "p.policy.npy: (10, 64)" grep -aq "'shape': (10, 64)" "$WORK/p.policy.npy"
expect_true "p.value.npy: (10, 1)" grep -aq "'shape': (10, 1)" "$WORK/p.value.npy"
expect_exit 0 "$DSTRAIN" predict "$WORK/neuro" --weights "$WORK/side.safetensors" --device cpu -q
expect_true "rates of 12 neurons, from the dataset's behavior field" \
    test "$(jq -c '.rates | length' "$OUT" | sort -u)" = 12
expect_exit 2 "$DSTRAIN" predict "$WORK/stim.npy" --weights "$WORK/side.safetensors" --device cpu
expect_stderr "give its values for each sample with --side FILE.npy"
expect_exit 0 "$DSTRAIN" predict "$WORK/stim.npy" --weights "$WORK/side.safetensors" --device cpu \
    --side "$WORK/behavior.npy" -q
expect_true "10 lines" test "$(wc -l <"$OUT")" -eq 10

# --init-from: the same heads continue; another loss is refused, naming it.
expect_exit 0 "$DSTRAIN" "$WORK/chess" "${CPU[@]}" --model "$HEADS" --epochs 1 --init-from "$WORK/chess.safetensors" \
    --save "$WORK/tuned.safetensors"
expect_exit 2 "$DSTRAIN" "$WORK/neuro" "${CPU[@]}" --model mlp:16 --loss poisson-exp --init-from "$WORK/poisson.safetensors" \
    --save "$WORK/x.safetensors"
expect_stderr "holds another network \(loss poisson in the file, poisson-exp here\)"

# Resume: a two-head run stopped at --max-steps continues to the end.
expect_exit 0 "$DSTRAIN" "$WORK/chess" "${CPU[@]}" --model "$HEADS" --epochs 2 --checkpoint "$WORK/ck" --max-steps 5
expect_exit 0 "$DSTRAIN" --checkpoint "$WORK/ck" --resume
expect_stdout "^epoch 2/2 "
expect_true "the checkpoint records the targets" grep -aq "$MOVES:ce,results:mse" "$WORK/ck/checkpoint.dstk"
finish
