#!/usr/bin/env bash
# A user's own arrays in: numpy writes the inputs (two-file npz, usual array
# names, int64 labels, HWC images), dsconvert imports them, and each dataset
# trains for an epoch with dstrain on the CPU.
. "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
T="$BIN/dstrain"
PY=$(numpy_python)
[ -n "$PY" ] || skip "no python3 with numpy (tried python3 and /usr/bin/python3)"
cd "$WORK"

"$PY" - <<'PY'
import numpy as np
rng = np.random.default_rng(3)
n = 120
y = rng.integers(0, 4, size=n)                       # int64, numpy's default
x = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)  # HWC
x[np.arange(n), y, :, :] = 255                       # learnable: the row of the label is bright
np.savez("images.npz", x)                            # one array: arr_0
np.savez("labels.npz", y)
np.savez("split.npz", x_train=x[:100], y_train=y[:100], x_test=x[100:], y_test=y[100:])
np.savez("named.npz", images=x, labels=y)
np.savez_compressed("sk.npz", data=x.astype(np.float32) / 255, target=y.astype(np.int16))
np.savez("custom.npz", pix=x, cls=y)
np.save("x.npy", x)
np.save("y.npy", y.astype(np.uint8))
y.astype(np.int32).tofile("y.raw")
np.save("neg.npy", np.where(np.arange(n) == 7, -1, y))
np.save("chw.npy", np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
PY

MODEL=(--device cpu -T 2 --model "conv3x3:4,relu,maxpool2,flatten,fc:4" --epochs 1 --batch 20 --seed 1)
# field NAME DIR: shape and dtype of field NAME of the first split, as "dtype shape".
field() {
    "$PY" -c "import json,sys; m=json.load(open(sys.argv[1]+'/dataset.json')); s=m['splits'][0]
f=[f for f in s['fields'] if f['name']==sys.argv[2]][0]; print(f['dtype'], 'x'.join(map(str,f['shape'])), m.get('num_classes'))" "$2" "$1"
}
expect_field() { # expect_field DIR NAME "dtype shape classes"
    CHECKS=$((CHECKS + 1))
    local got
    got=$(field "$2" "$1")
    [ "$got" = "$3" ] || fail "$1 field $2: got '$got', expected '$3'"
}

# Two .npz files of one array each (arr_0): images become x, --labels gives y.
expect_exit 0 "$D" images.npz two --labels labels.npz
expect_stderr "x: samples of shape 8x8x3 read as height x width x channels and transposed to 3x8x8"
expect_field two x "u8 3x8x8 4"
expect_field two y "i32  4"
expect_exit 0 "$D" --verify two
expect_exit 0 "$T" two "${MODEL[@]}"
expect_stdout "epoch 1"
# The transposition is exact: sample 5's channel 2 is the HWC array's [..., 2].
"$PY" - <<'PY' || fail "HWC -> CHW transposition differs from numpy's"
import numpy as np
x = np.load("images.npz")["arr_0"]
got = np.load("two/train_x.npy")
assert got.shape == (120, 3, 8, 8) and (got == x.transpose(0, 3, 1, 2)).all()
y = np.load("two/train_y.npy"); assert y.dtype == np.int32 and (y == np.load("labels.npz")["arr_0"]).all()
PY

# x_train/y_train/x_test/y_test with int64 labels.
expect_exit 0 "$D" split.npz sp
expect_field sp y "i32  4"
expect_exit 0 "$T" sp "${MODEL[@]}"
# The usual names give the roles: images/labels, data/target (float inputs,
# int16 labels); the fields keep the arrays' names.
expect_exit 0 "$D" named.npz named
expect_stderr "images: samples of shape 8x8x3 read as height x width x channels"
expect_field named images "u8 3x8x8 4"
expect_exit 0 "$D" sk.npz sk
expect_field sk data "f32 3x8x8 4"
expect_field sk target "i32  4"
expect_exit 0 "$T" sk "${MODEL[@]}"
# Other names, given with options (--x-array and --y-array: the old names of --input and --label).
expect_exit 0 "$D" custom.npz custom --x-array pix --y-array cls
expect_field custom cls "i32  4"
expect_exit 0 "$T" custom "${MODEL[@]}"
expect_exit 2 "$D" custom.npz nope --x-array pixels
expect_stderr "--input pixels: .* has no such array \(it has: pix, cls\)"
# .npy images with .npy (u8) or raw (--label-dtype) labels.
expect_exit 0 "$D" x.npy n1 --labels y.npy
expect_field n1 y "i32  4"
expect_exit 0 "$D" x.npy n2 --labels y.raw --label-dtype i32 --num-classes 6
expect_field n2 y "i32  6"
expect_exit 0 "$T" n2 --device cpu -T 2 --model "conv3x3:4,relu,maxpool2,flatten,fc:6" --epochs 1 --batch 20
# Labels are checked: negative, more than the images, too few classes.
expect_exit 1 "$D" x.npy bad1 --labels neg.npy
expect_stderr "include -1 \(class labels are indices 0 .. N-1\)"
expect_no_file bad1
expect_exit 1 "$D" x.npy bad2 --labels split.npz
expect_stderr "holds 4 arrays"
expect_exit 2 "$D" x.npy bad3 --labels y.npy --num-classes 3
expect_stderr "--num-classes 3 is too small"
expect_exit 2 "$D" split.npz bad4 --labels y.npy
expect_stderr "--labels gives the labels of one set of images"
# CHW arrays are left alone; --in-layout says what auto cannot tell.
expect_exit 0 "$D" chw.npy chw --labels y.npy
expect_field chw x "u8 3x8x8 4"
expect_exit 0 "$D" x.npy hwc --labels y.npy --in-layout nchw
expect_field hwc x "u8 8x8x3 4"
expect_exit 2 "$D" x.npy hwc2 --in-layout sideways
expect_stderr "invalid --in-layout 'sideways' \(expected auto, nhwc or nchw\)"

# A manifest never names a field that does not exist; --verify says so.
cp -r n1 broken
sed -i 's/"input_field": "x"/"input_field": "arr_0"/' broken/dataset.json
expect_exit 1 "$D" --verify broken
expect_stderr "input_field.*names field 'arr_0', which split 'train' does not have"

# '-' as OUTPUT is stdout for --to npy|raw.
"$D" n1 - --select train/x --to npy >out.npy 2>"$ERR"
expect_true "dsconvert ... - --to npy writes the array on stdout" "$PY" -c "
import numpy as np; a = np.load('out.npy'); assert a.shape == (120, 3, 8, 8), a.shape"
expect_no_file ./-
"$D" n1 - --select train/y --to raw >out.raw 2>"$ERR"
tail -c 480 n1/train_y.npy >ref.raw
expect_same out.raw ref.raw
expect_exit 2 "$D" n1 - --select train/x
expect_stderr "OUTPUT '-' is stdout"
finish
