#!/usr/bin/env bash
# What a new user meets in the first hour (issue 28): dstrain --tensorboard,
# dsbench compare --plot (and its errors without Python or matplotlib),
# dstrain's CPU epoch estimate and its class count's origin, predict on flat
# samples, dsconvert --select's report of the field written.
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
DSCONVERT="$BIN/dsconvert"
DSB="$BIN/dsbench"
for t in "$DSTRAIN" "$DSGEN" "$DSCONVERT" "$DSB"; do [ -x "$t" ] || skip "no $(basename "$t") in $BIN"; done

"$DSGEN" "$WORK/ds" --train 512 --test 128 --shape 3x8x8 --classes 4 --seed 7 -q >/dev/null || { echo "dsgen failed" >&2; exit 1; }
CPU=(--device cpu -T 2 --batch 64 --model mlp:16)

# --tensorboard: a new events file per run in DIR (created), never over a file.
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${CPU[@]}" --epochs 2 --tensorboard "$WORK/tb/run" --save "$WORK/m.safetensors"
expect_stderr "TensorBoard events in $WORK/tb/run/events\.out\.tfevents\.[0-9]+\."
# The CPU estimate before the first step, the class count with its origin.
expect_stderr 'on the CPU: about [0-9.]+ (s|ms|min)[^ ]* per epoch \([0-9,]+ samples/s'
expect_stderr '4 classes \(num_classes of dataset\.json, written by dsgen\)'
expect_true "one events file" test "$(ls "$WORK/tb/run" | grep -c '^events\.out\.tfevents\.')" = 1
expect_true "the events file starts with a TFRecord of the file version" grep -q 'brain\.Event:2' "$WORK/tb/run"/events.*
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${CPU[@]}" --epochs 1 --tensorboard "$WORK/tb/run" --save "$WORK/m.safetensors" \
    --force -q
expect_true "a second run, a second file" test "$(ls "$WORK/tb/run" | wc -l)" = 2
: >"$WORK/notadir"
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${CPU[@]}" --epochs 1 --tensorboard "$WORK/notadir" --save "$WORK/m2.safetensors"
expect_stderr "cannot write --tensorboard '$WORK/notadir/' \('$WORK/notadir' is not a directory\); choose another path"

# dsconvert: the class count and where it came from; --select reports the field written.
PY=$(numpy_python)
if [ -n "$PY" ]; then
    "$PY" -c "
import numpy as np
rng = np.random.default_rng(1)
np.savez('$WORK/in.npz', x=rng.integers(0, 255, (300, 3, 8, 8), dtype=np.uint8),
         y=rng.integers(0, 5, 300).astype(np.int32), robs=rng.random((300, 7), dtype=np.float32))
" || fail "numpy could not write the input"
    expect_exit 0 "$DSCONVERT" "$WORK/in.npz" "$WORK/conv" --split train=0.8,test=0.2
    expect_stderr 'classes: 5 \(from the largest label \+ 1; a class no sample shows is not counted: give --num-classes N'
    expect_exit 0 "$DSTRAIN" "$WORK/conv" "${CPU[@]}" --epochs 1 --save "$WORK/c.safetensors"
    expect_stderr '5 classes \(num_classes of dataset\.json, from the largest label \+ 1 \(dsconvert\)\)'
    expect_exit 0 "$DSCONVERT" "$WORK/conv" "$WORK/robs.npy" --select test/robs
    expect_stderr '^dsconvert: 60 samples of test/robs .* -> .*robs\.npy: 1\.6 KiB -> '
    expect_exit 0 "$DSCONVERT" "$WORK/conv" "$WORK/robs2.npy" --select test/robs --json
    expect_true "--json: the selected field's samples" test "$(jq .samples "$OUT")" = 60
    expect_true "--json: what was selected" test "$(jq -r .selected "$OUT")" = test/robs

    # predict: flat samples of the model's size are read as its C x H x W; channels last is refused with the fix.
    "$PY" -c "
import numpy as np
x = np.load('$WORK/ds/test_x.npy')
np.save('$WORK/flat.npy', x.reshape(len(x), -1))
np.save('$WORK/hwc.npy', np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
" || fail "numpy could not reshape the samples"
    expect_exit 0 "$DSTRAIN" predict "$WORK/ds/test_x.npy" --weights "$WORK/m.safetensors" --device cpu -o "$WORK/p1.npy"
    expect_exit 0 "$DSTRAIN" predict "$WORK/flat.npy" --weights "$WORK/m.safetensors" --device cpu -o "$WORK/p2.npy"
    expect_stderr 'holds flat samples of 192 values: read as the model.s 3x8x8'
    expect_same "$WORK/p1.npy" "$WORK/p2.npy"
    expect_exit 2 "$DSTRAIN" predict "$WORK/hwc.npy" --weights "$WORK/m.safetensors" --device cpu -o "$WORK/p3.npy"
    expect_stderr 'channels last\? numpy\.ascontiguousarray\(x\.transpose\(0, 3, 1, 2\)\)'
fi

# dsbench compare --plot: a PNG through plot.py, with the python DSTK_PYTHON names.
"$DSB" all "$WORK/ds" --cases 'io.seq.pread.warm,decode.convert.cpu.u8' --repetitions 2 --min-time 0 --threads 1 \
    --size 1M --json "$WORK/a.json" -q >/dev/null 2>&1 || fail "dsbench all failed"
cp "$WORK/a.json" "$WORK/b.json"
MPL=$(plot_python)
if [ -n "$MPL" ]; then
    expect_exit 0 env DSTK_PYTHON="$MPL" "$DSB" compare "$WORK/a.json" "$WORK/b.json" --plot "$WORK/cmp.png"
    expect_stdout 'io\.seq\.pread\.warm'
    expect_true "a PNG" test "$(head -c 8 "$WORK/cmp.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a
    expect_exit 2 env DSTK_PYTHON="$MPL" "$DSB" compare "$WORK/a.json" "$WORK/b.json" --plot "$WORK/cmp.png"
    expect_stderr 'exists'
    expect_exit 0 env DSTK_PYTHON="$MPL" "$DSB" compare "$WORK/a.json" "$WORK/b.json" --plot "$WORK/cmp.png" --force
    # Without matplotlib: exit 3, saying what to install; nothing left behind.
    mkdir -p "$WORK/nompl/matplotlib"
    echo 'raise ImportError("no matplotlib in this test")' >"$WORK/nompl/matplotlib/__init__.py"
    expect_exit 3 env DSTK_PYTHON="$MPL" PYTHONPATH="$WORK/nompl" "$DSB" compare "$WORK/a.json" "$WORK/b.json" \
        --plot "$WORK/none.png"
    expect_stderr 'lacks matplotlib.*python3-matplotlib'
    expect_no_file "$WORK/none.png"
fi
expect_exit 3 env DSTK_PYTHON="$WORK/no-such-python" "$DSB" compare "$WORK/a.json" "$WORK/b.json" --plot "$WORK/n.png"
expect_stderr 'cannot be started .*DSTK_PYTHON'
expect_no_file "$WORK/n.png"
finish
