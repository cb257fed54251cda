#!/usr/bin/env bash
# Non-finite inputs are bad data (exit 1, the sample and field named) even
# when the manifest carries per-channel statistics, as dsgen writes them: the
# statistics were computed before the values went bad, so they are finite.
source "$(dirname "$0")/lib.sh"
G="$BIN/dsgen"
T="$BIN/dstrain"
[ -x "$G" ] && [ -x "$T" ] || skip "no dsgen/dstrain binary in $BIN"
PY=$(numpy_python)
[ -n "$PY" ] || skip "numpy is needed to write NaN into a dataset"

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
