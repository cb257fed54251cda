#!/usr/bin/env bash
# dsconvert --concat (issue 25): datasets with the same fields joined in order
# into one, by hard links (copies where no link reaches); the values equal the
# members' in order, the optional dataset field holds each sample's member,
# the statistics are the concatenation's; a missing field, a dtype, shape or
# storage that differs, other roles, a --shard part: errors that name them.
. "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
PY=$(numpy_python)
[ -n "$PY" ] || skip "no python3 with numpy (tried python3 and /usr/bin/python3)"
cd "$WORK" || exit 1

"$PY" - <<'PY'
import numpy as np
r = np.random.default_rng(9)
def member(name, train, test, robs=np.float32, drop=None):
    arrays = {}
    for split, n in (("train", train), ("test", test)):
        if n == 0:
            continue
        arrays["stim_" + split] = r.integers(0, 256, (n, 1, 6, 6)).astype(np.uint8)
        arrays["robs_" + split] = (r.poisson(3.0, (n, 8)) * (1 + len(name))).astype(robs)
        arrays["y_" + split] = r.integers(0, 3 + len(name), n).astype(np.int64)
    for k in [k for k in arrays if drop and k.startswith(drop)]:
        del arrays[k]
    np.savez(name + ".npz", **arrays)
member("a", 300, 50)
member("bb", 200, 0)
member("ccc", 100, 20)
member("norobs", 10, 0, drop="robs")
member("half", 10, 0, robs=np.float16)
PY
for m in a bb ccc norobs half; do expect_exit 0 "$D" "$m.npz" "$m" --input stim --label y -q; done

# ---- three members in order, with the dataset field ------------------------
expect_exit 0 "$D" --concat a bb ccc abc --dataset-field
expect_stderr "concatenated 3 datasets \(train 600, test 70 samples, .* hard-linked, nothing copied\) -> abc"
expect_exit 0 "$D" --verify abc
expect_true "a member's file is hard-linked, not copied" test "$(stat -c %h a/train_stim.npy)" -eq 2
expect_exit 0 "$D" abc abc-flat -q # read through the parts, written as single files
CHECKS=$((CHECKS + 1))
"$PY" - <<'PY' || fail "the concatenation differs from the members in order"
import json
import numpy as np
src = {k: np.load(k + ".npz") for k in ("a", "bb", "ccc")}
m = json.load(open("abc/dataset.json"))
assert m["input_field"] == "stim" and m["label_field"] == "y"
assert m["num_classes"] == max(json.load(open(k + "/dataset.json"))["num_classes"] for k in src)
for split in ("train", "test"):
    have = [k for k in src if "stim_" + split in src[k].files]
    for field in ("stim", "robs", "y"):
        want = np.concatenate([src[k][field + "_" + split] for k in have])
        got = np.load("abc-flat/%s_%s.npy" % (split, field))
        assert (got == want).all(), (split, field)
    index = np.concatenate([np.full(len(src[k]["y_" + split]), i, np.int32) for i, k in enumerate(src) if k in have])
    got = np.load("abc-flat/%s_dataset.npy" % split)
    assert got.dtype == np.int32 and (got == index).all(), split
fields = {f["name"]: f for f in m["splits"][0]["fields"]}
assert [f["name"] for f in m["splits"][0]["fields"]] == ["stim", "robs", "y", "dataset"]
assert len(fields["stim"]["parts"]) == 3 and fields["stim"]["parts"][1]["samples"] == 200
for field in ("stim", "robs"):
    v = np.concatenate([src[k][field + "_train"] for k in src]).astype(np.float64)
    axes = (0, 2, 3) if field == "stim" else 0
    st = fields[field]["stats"]
    assert np.allclose(st["mean"], np.atleast_1d(v.mean(axis=axes)), rtol=1e-10), field
    assert np.allclose(st["std"], np.atleast_1d(v.std(axis=axes)), rtol=1e-7), field
assert "stats" not in fields["y"] and "stats" not in fields["dataset"]
assert m["stats"] == fields["stim"]["stats"]
PY
# Without --dataset-field: the members' fields only.
expect_exit 0 "$D" --concat ccc a ca --json
expect_stdout '"members": 2'
expect_stdout '"method": "link"'
expect_true "no dataset field without --dataset-field" "$PY" -c "
import json; m = json.load(open('ca/dataset.json'))
assert [f['name'] for f in m['splits'][0]['fields']] == ['stim', 'robs', 'y']"

# A member in parts (a --merge of --shard parts) and zstd-chunked members whose
# last chunks are short: their files become parts in order, read as one run.
expect_exit 0 "$D" a a-s0 --shard 0/2 --chunk-samples 64 -q
expect_exit 0 "$D" a a-s1 --shard 1/2 --chunk-samples 64 -q
expect_exit 0 "$D" --merge a-s0 a-s1 a-merged -q
expect_exit 0 "$D" --concat a-merged bb amb -q
expect_exit 0 "$D" amb amb-flat -q
for f in train_stim.npy train_robs.npy train_y.npy; do
    expect_true "$f of a merged member then bb" "$PY" -c "
import numpy as np, sys
got, a, b = (np.load(p) for p in ('amb-flat/$f', 'a/$f', 'bb/$f'))
assert (got == np.concatenate([a, b])).all()"
done
expect_exit 0 "$D" a az1 --compress zstd --chunk-samples 64 -q
expect_exit 0 "$D" bb az2 --compress zstd --chunk-samples 64 -q
expect_exit 0 "$D" --concat az1 az2 az12 -q
expect_exit 0 "$D" --verify az12
expect_exit 0 "$D" az12 az12-flat -q
expect_true "zstd members with short last chunks read back in order" "$PY" -c "
import numpy as np
got = np.load('az12-flat/train_robs.npy')
assert (got == np.concatenate([np.load('a/train_robs.npy'), np.load('bb/train_robs.npy')])).all()"

# ---- errors ---------------------------------------------------------------
expect_exit 2 "$D" --concat a norobs bad
expect_stderr "split 'train' of 'norobs' has no field 'robs', which 'a' has"
expect_exit 2 "$D" --concat norobs a bad
expect_stderr "'a' has a field 'robs' \(split 'train'\) that 'norobs' lacks"
expect_exit 2 "$D" --concat a half bad
expect_stderr "field 'robs' is f32\[8\] in 'a' but f16\[8\] in 'half' .*dsconvert --dtype robs=f32"
expect_exit 0 "$D" a.npz az --input stim --label y --compress zstd -q
expect_exit 2 "$D" --concat a az bad
expect_stderr "field 'stim' is stored as npy in 'a' but zstd-chunked \(.* samples per chunk\) in 'az'"
expect_exit 0 "$D" a a-robs --label robs -q
expect_exit 2 "$D" --concat a a-robs bad
expect_stderr "the members give the roles to different fields \('a': input stim, label y; 'a-robs': input stim, label robs\)"
expect_exit 0 "$D" a a-0 --shard 0/2 -q
expect_exit 2 "$D" --concat a a-0 bad
expect_stderr "'a-0' is part 0/2 of a --shard run; join its parts with --merge first"
expect_exit 2 "$D" --concat a bad
expect_stderr "--concat joins two or more datasets"
expect_exit 2 "$D" --concat abc a bad --dataset-field
expect_stderr "--dataset-field adds a field 'dataset', which the members already have"
expect_exit 2 "$D" --concat a bb bad --dtype bf16
expect_stderr "--concat only joins datasets \(their samples are not rewritten\)"
expect_exit 2 "$D" --concat a bb a
expect_stderr "--concat OUTPUT 'a' is one of its inputs"
expect_exit 2 "$D" a bad --dataset-field
expect_stderr "--dataset-field goes with --concat"
expect_exit 2 "$D" --concat a bb --merge a bb bad
expect_stderr "give --merge or --concat, not both"
expect_exit 1 "$D" --concat a nothing-here bad
expect_stderr "'nothing-here' is not a dataset directory"
cp -r bb cut && truncate -s -1 cut/train_robs.npy
expect_exit 1 "$D" --concat a cut bad
expect_stderr "cut/train_robs.npy' has .* bytes but 'cut' says"
expect_no_file bad

# ---- another filesystem: the files that cannot be linked are copied -------
if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(stat -c %d /dev/shm)" != "$(stat -c %d .)" ]; then
    other=$(mktemp -d /dev/shm/dstk-concat.XXXXXX)
    expect_exit 0 "$D" --concat a bb "$other/ab"
    expect_stderr "cannot hard-link .* copying the files that cannot be linked"
    expect_stderr "concatenated 2 datasets .* copied \(39.8 KiB\)\) -> "
    expect_exit 0 "$D" --verify "$other/ab"
    expect_true "copied, not linked" test "$(stat -c %h "$other/ab/train_robs-00001-of-00002.npy")" -eq 1
    expect_exit 0 "$D" --concat a bb "$other/ab2" --json
    expect_stdout '"method": "copy"'
    expect_stdout '"copied_files": 9'
    expect_true "the copy equals the linked concatenation" cmp -s "$other/ab2/train_robs-00001-of-00002.npy" bb/train_robs.npy
    rm -rf "$other"
fi

# ---- --move: the members' files move into OUTPUT, their directories go ----
expect_exit 0 "$D" --concat a ccc ac -q
cp -r a mv-a && cp -r ccc mv-c
expect_exit 0 "$D" --concat mv-a mv-c mv --move
expect_stderr "moved, nothing copied"
expect_no_file mv-a
expect_no_file mv-c
expect_exit 0 "$D" --verify mv
expect_true "moved concatenation equals the linked one" cmp -s <("$PY" -c "
import json; m = json.load(open('mv/dataset.json')); print(m['splits'], m['stats'])") <("$PY" -c "
import json; m = json.load(open('ac/dataset.json')); print(m['splits'], m['stats'])")

finish
