#!/usr/bin/env bash
# Every array of a sample in (issue 24): a chess-shaped and a
# neuroscience-shaped .npz, a directory of .npy files, unlabeled data; one
# field per array with its name, roles set by --input/--label (or their old
# names) or not at all, --dtype FIELD=DTYPE, the per-field statistics against
# numpy's, and the errors that name the arrays and the flags.
. "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
PY=$(numpy_python)
[ -n "$PY" ] || skip "no python3 with numpy (tried python3 and /usr/bin/python3)"
cd "$WORK" || exit 1

"$PY" - <<'PY'
import os
import numpy as np
r = np.random.default_rng(5)
n = 500
np.savez("chess.npz", positions=r.integers(-1, 2, (n, 12, 8, 8)).astype(np.int8),
         moves=r.integers(0, 4672, n).astype(np.int32), results=r.integers(-1, 2, n).astype(np.int8))
np.savez_compressed("neuro.npz", stim=r.integers(0, 256, (n, 1, 36, 36)).astype(np.uint8),
                    robs=r.poisson(2.0, (n, 120)).astype(np.float32), behavior=r.normal(size=(n, 4)).astype(np.float32))
np.savez("unlabeled.npz", stim=r.integers(0, 256, (n, 1, 6, 6)).astype(np.uint8))
b = r.normal(size=(n, 3)).astype(np.float32)
b[:, 1] = 7.0
np.savez("constant.npz", x=r.random((n, 2), dtype=np.float32), behavior=b)
os.mkdir("npys")
pos, mv = r.integers(-1, 2, (n, 12, 8, 8)).astype(np.int8), r.integers(0, 4672, n).astype(np.int64)
np.save("npys/positions_train.npy", pos[:400]); np.save("npys/positions_test.npy", pos[400:])
np.save("npys/moves_train.npy", mv[:400]); np.save("npys/moves_test.npy", mv[400:])
open("npys/README.txt", "w").write("not an array")
PY

# check DIR PYTHON: runs PYTHON with m (DIR's manifest), f(split, name) (its
# field entry), a(split, name) (its .npy array) and np; fails on an exception.
check() {
    local dir=$1
    shift
    CHECKS=$((CHECKS + 1))
    "$PY" - "$dir" >"$WORK/.check" 2>&1 <<PYEOF || { cat "$WORK/.check" >&2; fail "check of $dir"; }
import json, sys
import numpy as np
d = sys.argv[1]
m = json.load(open(d + "/dataset.json"))
def f(split, name):
    s = [s for s in m["splits"] if s["name"] == split][0]
    return [x for x in s["fields"] if x["name"] == name][0]
def a(split, name):
    return np.load(d + "/" + f(split, name)["file"])
def close(stats, mean, std):
    assert np.allclose(stats["mean"], mean, rtol=1e-9, atol=1e-9), (stats["mean"][:4], list(mean)[:4])
    assert np.allclose(stats["std"], std, rtol=1e-7, atol=1e-9), (stats["std"][:4], list(std)[:4])
$*
PYEOF
}

# ---- chess: three arrays, no usual names: three fields, no roles ---------
expect_exit 0 "$D" chess.npz chess
expect_stderr "chess.npz: no array is named as the input or the label \(its fields: positions i8\[12x8x8\], moves i32, results i8\).*give --input NAME and --label NAME"
check chess '
src = np.load("chess.npz")
assert [x["name"] for x in m["splits"][0]["fields"]] == ["positions", "moves", "results"]
assert m["input_field"] == "" and m["label_field"] == "" and "num_classes" not in m and "stats" not in m
for k in src.files:
    assert (a("train", k) == src[k]).all() and a("train", k).dtype == src[k].dtype, k
    assert "stats" not in f("train", k), k  # signed fields, none the input
'
expect_exit 0 "$D" --verify chess
# The roles by name: the label is counted into classes, the input gets statistics (12 channels).
expect_exit 0 "$D" chess.npz chess-roles --input positions --label moves --num-classes 4672
check chess-roles '
src = np.load("chess.npz")
assert m["input_field"] == "positions" and m["label_field"] == "moves" and m["num_classes"] == 4672
p = src["positions"].astype(np.float64)
close(f("train", "positions")["stats"], p.mean(axis=(0, 2, 3)), p.std(axis=(0, 2, 3)))
assert m["stats"] == f("train", "positions")["stats"]  # top-level too, for older readers
assert "stats" not in f("train", "moves") and "stats" not in f("train", "results")
assert (a("train", "results") == src["results"]).all() and a("train", "results").dtype == np.int8
'
# The old names of the flags are aliases.
expect_exit 0 "$D" chess.npz chess-alias --x-array positions --y-array moves --num-classes 4672
expect_same chess-roles/train_positions.npy chess-alias/train_positions.npy
check chess-alias 'assert m["input_field"] == "positions" and m["label_field"] == "moves"'
# A dataset without roles gets them by converting it again.
expect_exit 0 "$D" chess chess-set --input positions --label moves
check chess-set 'assert m["input_field"] == "positions" and m["label_field"] == "moves" and m["num_classes"] == int(np.load("chess.npz")["moves"].max()) + 1'

# ---- neuroscience: u8 stimulus, f32 responses and behaviour; targets as bf16
expect_exit 0 "$D" neuro.npz neuro --input stim --dtype robs=bf16 --dtype behavior=bf16
expect_stderr "robs: f32 -> bf16: exact"
expect_stderr "behavior: f32 -> bf16: max abs error"
check neuro '
src = np.load("neuro.npz")
def bf16(x):  # round to nearest even, as dsconvert does
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).astype(np.float64)
assert m["input_field"] == "stim" and m["label_field"] == ""
assert f("train", "robs")["dtype"] == "bf16" and f("train", "behavior")["dtype"] == "bf16"
assert f("train", "stim")["dtype"] == "u8" and (a("train", "stim") == src["stim"]).all()
assert (a("train", "robs").view(np.uint16) == (bf16(src["robs"]).astype(np.float32).view(np.uint32) >> 16)).all()
s = src["stim"].astype(np.float64)
close(f("train", "stim")["stats"], [s.mean()], [s.std()])
for k in ("robs", "behavior"):
    v = bf16(src[k])
    close(f("train", k)["stats"], v.mean(axis=0), v.std(axis=0))
assert len(f("train", "robs")["stats"]["mean"]) == 120
assert m["stats"] == f("train", "stim")["stats"]
'
# zstd storage: the same statistics (u8 sums are exact whatever the rows).
expect_exit 0 "$D" neuro.npz neuro-z --input stim --compress zstd --chunk-samples 64
check neuro-z 'assert f("train", "stim")["stats"] == json.load(open("neuro/dataset.json"))["splits"][0]["fields"][0]["stats"]'
# Re-split: the statistics are the train split's.
expect_exit 0 "$D" neuro.npz neuro-split --input stim --split train=0.8,test=0.2
check neuro-split '
s = np.load("neuro.npz")["stim"][:400].astype(np.float64)
close(f("train", "stim")["stats"], [s.mean()], [s.std()])
assert "stats" not in f("test", "stim")
'
# A constant channel has no usable std: no statistics for that field, and a notice.
expect_exit 0 "$D" constant.npz constant
expect_stderr "no statistics written for field behavior: channel 1 is constant \(std 0\)"
check constant 'assert "stats" not in f("train", "behavior") and len(f("train", "x")["stats"]["mean"]) == 2'

# ---- a directory of .npy files: one field per file, splits from the names --
expect_exit 0 "$D" npys npyds --input positions --label moves
check npyds '
src = {k: np.load("npys/" + k + ".npy") for k in ("positions_train", "positions_test", "moves_train", "moves_test")}
assert [s["name"] for s in m["splits"]] == ["test", "train"] or [s["name"] for s in m["splits"]] == ["train", "test"]
for sp in ("train", "test"):
    assert (a(sp, "positions") == src["positions_" + sp]).all()
    assert (a(sp, "moves") == src["moves_" + sp]).all() and a(sp, "moves").dtype == np.int32
assert m["input_field"] == "positions" and "stats" in f("train", "positions")
'
expect_exit 0 "$D" npys npyds-plain --from npy
expect_stderr "npys: no array is named as the input or the label"
mkdir empty-dir
expect_exit 2 "$D" empty-dir nothing
expect_stderr "cannot tell the format of directory 'empty-dir' \(no dataset.json, CIFAR-10 batches, v28b, IDX or .npy files\)"

# ---- unlabeled: a lone array is the input; no label field ----------------
expect_exit 0 "$D" unlabeled.npz unl
check unl '
assert m["input_field"] == "stim" and m["label_field"] == "" and "num_classes" not in m
assert len(f("train", "stim")["stats"]["mean"]) == 1
'
expect_exit 0 "$D" --verify unl

# ---- errors: what, why, the flags ----------------------------------------
expect_exit 2 "$D" chess.npz bad --dtype f16
expect_stderr "--dtype f16 converts the input field, and 'chess.npz' names no input field \(its fields: positions i8\[12x8x8\], moves i32, results i8\); give --input NAME"
expect_exit 2 "$D" chess.npz bad --range auto
expect_stderr "--scale, --offset and --range map the input field"
expect_exit 2 "$D" chess.npz bad --input nope
expect_stderr "--input nope: chess.npz has no such array \(it has: positions, moves, results\)"
expect_exit 2 "$D" chess.npz bad --input positions --label positions
expect_stderr "name the same field 'positions'"
expect_exit 2 "$D" neuro.npz bad --dtype nope=bf16
expect_stderr "the input has no field 'nope' \(its fields: stim u8\[1x36x36\], robs f32\[120\], behavior f32\[4\]\)"
expect_exit 2 "$D" neuro.npz bad --dtype robs=u8
expect_stderr "converting float f32 field 'robs' to an integer type would clip and round it"
expect_exit 2 "$D" neuro.npz bad --dtype robs=bf16 --dtype robs=f16
expect_stderr "names field 'robs' twice"
expect_exit 2 "$D" neuro.npz bad --dtype bf16 --dtype f16
expect_stderr "a bare DTYPE is the input field's, and one was given already"
expect_exit 2 "$D" chess.npz bad --input positions --label moves --dtype moves=i64
expect_stderr "'moves' is the class label, stored as i32"
expect_exit 2 "$D" neuro.npz bad --input stim --dtype stim=f32 --dtype bf16
expect_stderr "gives the input field 'stim' two dtypes"
expect_exit 2 "$D" chess.npz bad.npy
expect_stderr "the input names no input field .*choose one with --select SPLIT/FIELD"
expect_no_file bad
expect_no_file bad.npy
# --dtype INPUT=DTYPE is the bare --dtype of the input field.
expect_exit 0 "$D" neuro.npz stim16 --input stim --dtype stim=f16
check stim16 'assert f("train", "stim")["dtype"] == "f16" and f("train", "robs")["dtype"] == "f32"'
expect_exit 0 "$D" chess.npz moves.npy --select train/moves
expect_true "--select of a field of a dataset without roles" "$PY" -c "
import numpy as np; assert (np.load('moves.npy') == np.load('chess.npz')['moves']).all()"

finish
