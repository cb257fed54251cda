#!/usr/bin/env bash
# One entrance to the data path: dsplan --dataset, dsbench's loader case and
# dstrain print the same plan (placement, order and chunk, fields, readers,
# prefetch, O_DIRECT, host and device ceilings) for the same dataset and
# request, each from data::plan_source; dsplan --json carries it too; the
# plan's messages name each tool's own flags.
source "$(dirname "$0")/lib.sh"
for t in dsgen dsplan dsbench dstrain; do [ -x "$BIN/$t" ] || skip "no $t binary in $BIN"; done

"$BIN/dsgen" "$WORK/ds" --train 3000 --test 300 --shape 3x8x8 --classes 4 --seed 2 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
plan_lines() { grep -o 'data path: .*' "$1"; }

for order in chunk sequential; do
    expect_exit 0 "$BIN/dsplan" --dataset "$WORK/ds" --data stream --order "$order" --batch 64
    expect_stdout '^data path \(as dstrain builds it'
    expect_stdout "data path: stream on (cpu|cuda:0), order $order"
    expect_stdout 'data path: fields x u8\[3x8x8\] \+ y i32 \(196 B a sample, lead x\), readers 2, prefetch 4, O_DIRECT off'
    expect_stdout 'data path: host .* \(ring .* \+ window cache .* \+ buffers .*\)'
    expect_stdout 'placement: --data stream'
    plan_lines "$OUT" >"$WORK/dsplan.txt"

    expect_exit 0 "$BIN/dsbench" all "$WORK/ds" --cases "loader.stream.$order" --batch 64 --repetitions 1 --min-time 0
    plan_lines "$ERR" >"$WORK/dsbench.txt"
    expect_same "$WORK/dsplan.txt" "$WORK/dsbench.txt"

    expect_exit 0 "$BIN/dstrain" "$WORK/ds" --data stream --order "$order" --batch 64 --model mlp:16 --epochs 1 \
        --max-steps 2 -T 2
    plan_lines "$ERR" >"$WORK/dstrain.txt"
    expect_same "$WORK/dsplan.txt" "$WORK/dstrain.txt"
    [ "$order" = chunk ] && cp "$WORK/dsplan.txt" "$WORK/chunk.txt"
done

# --json: the same plan as a document.
expect_exit 0 "$BIN/dsplan" --dataset "$WORK/ds" --data stream --batch 64 --json
expect_true "dsplan --json has the data path" jq -e '.data_path.placement == "stream" and .data_path.readers == 2 and
    .data_path.prefetch == 4 and .data_path.host_bytes > 0 and (.data_path.fields | map(.name)) == ["x", "y"]' "$OUT"

# The settings are named as each tool spells them.
expect_exit 2 "$BIN/dstrain" "$WORK/ds" --data stream --prefetch 0 --model mlp:16 --epochs 1 -T 2
expect_stderr 'invalid --prefetch 0'
expect_exit 3 "$BIN/dstrain" "$WORK/ds" --data stream --host-mem 64K --model mlp:16 --epochs 1 -T 2
expect_stderr '--host-mem 64.0 KiB (is below|leaves nothing)'

# Chess-shaped data (an i8 input, two targets): dstrain takes the input by
# name (--input), widens i8 like u8, and delivers every field the trainer
# takes; a dataset without roles names the flag that sets one.
PY=$(numpy_python)
if [ -n "$PY" ] && [ -x "$BIN/dsconvert" ]; then
    (cd "$WORK" && "$PY" -c '
import numpy as np
r = np.random.default_rng(0); n = 512
np.savez("chess.npz", positions=r.integers(-1, 2, (n, 12, 8, 8)).astype(np.int8),
         moves=r.integers(0, 10, n).astype(np.int32), results=r.integers(-1, 2, n).astype(np.int8))')
    expect_exit 0 "$BIN/dsconvert" "$WORK/chess.npz" "$WORK/chess" --input positions --label moves -q
    expect_exit 0 "$BIN/dstrain" "$WORK/chess" --input positions --model mlp:16 --epochs 1 --max-steps 2 -T 2 \
        --batch 32 --device cpu
    expect_stderr 'data path: fields positions i8\[12x8x8\] \+ moves i32'
    expect_exit 0 "$BIN/dsconvert" "$WORK/chess.npz" "$WORK/bare" -q
    expect_exit 2 "$BIN/dstrain" "$WORK/bare" --model mlp:16 --epochs 1 -T 2 --device cpu
    expect_stderr 'no input role.*--input'
    expect_exit 2 "$BIN/dstrain" "$WORK/chess" --input board --model mlp:16 --epochs 1 -T 2 --device cpu
    expect_stderr '--input board: split .train. has no such field \(its fields: positions, moves, results\)'
fi
finish
