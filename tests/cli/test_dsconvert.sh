#!/usr/bin/env bash
# dsconvert end to end: formats in and out, numpy and zstd interop, the real
# MNIST test set, corrupted inputs, disk full, Ctrl-C, determinism.
. "$(dirname "$0")/lib.sh"
# The disk-full checks mount a small tmpfs under $WORK.
trap 'umount "$WORK/small" 2>/dev/null; rm -rf "$WORK"' EXIT
D="$BIN/dsconvert"
PY=$(numpy_python)
[ -n "$PY" ] || skip "no python3 with numpy (tried python3 and /usr/bin/python3)"
command -v zstd >/dev/null || skip "the zstd CLI is not installed"
cd "$WORK"

# no_leftovers DIR: no temporary outputs (".NAME.tmp-*") left in DIR.
no_leftovers() {
    CHECKS=$((CHECKS + 1))
    local left
    left=$(find "$1" -maxdepth 1 -name '.*.tmp-*' | head -3)
    [ -z "$left" ] || fail "temporary outputs left behind: $left"
}

# ---- usage --------------------------------------------------------------
expect_exit 0 "$D" --help
expect_stdout "--compress"
expect_exit 2 "$D" --no-such-option in out
expect_exit 2 "$D" in
expect_stderr "no output given"

# ---- numpy files in -----------------------------------------------------
"$PY" - <<'PY'
import numpy as np
rng = np.random.default_rng(1)
x = rng.integers(0, 256, size=(300, 3, 4, 5), dtype=np.uint8)
y = rng.integers(0, 10, size=300).astype(np.int32)
np.save("x.npy", x)
np.save("xbe.npy", rng.standard_normal((50, 7)).astype(">f4"))
np.save("xf.npy", np.asfortranarray(rng.standard_normal((40, 3, 5)).astype(np.float32)))
np.savez("plain.npz", x_train=x[:200], y_train=y[:200], x_test=x[200:], y_test=y[200:])
np.savez_compressed("deflated.npz", x_train=x[:200], y_train=y[:200], x_test=x[200:], y_test=y[200:])
np.save("ref_x.npy", x); np.save("ref_y.npy", y)
PY
# Non-finite mapping parameters are usage errors, not a dataset of NaN.
for bad in "--offset nan" "--scale nan" "--scale inf" "--offset -inf"; do
    # shellcheck disable=SC2086
    expect_exit 2 "$D" x.npy nanout --dtype f32 $bad
    expect_stderr "--(offset|scale).*(must be finite|not a finite number)"
    expect_no_file nanout
done
expect_exit 0 "$D" x.npy ds_npy
expect_exit 0 "$D" xbe.npy be.npy
expect_exit 0 "$D" xf.npy f.npy
expect_exit 0 "$D" plain.npz ds_plain
expect_exit 0 "$D" deflated.npz ds_defl --compress zstd --chunk-samples 64
expect_exit 0 "$D" --verify ds_defl
expect_stdout "OK"
expect_exit 0 "$D" ds_defl back.npy --select train/x
expect_true "numpy reads what we wrote, values intact" "$PY" -c '
import numpy as np, sys
x = np.load("ref_x.npy"); y = np.load("ref_y.npy")
assert (np.load("ds_npy/train_x.npy") == x).all()
assert (np.load("be.npy") == np.load("xbe.npy")).all() and np.load("be.npy").dtype == np.dtype("<f4")
f = np.load("f.npy"); assert f.flags.c_contiguous and (f == np.load("xf.npy")).all()
for d in ("ds_plain",):
    assert (np.load(d + "/train_x.npy") == x[:200]).all() and (np.load(d + "/test_y.npy") == y[200:]).all()
assert (np.load("back.npy") == x[:200]).all()
'

# ---- zstd-chunked storage: zstd -d reads the frames; output independent of threads
expect_exit 0 "$D" ds_npy z1 --compress zstd:3 --chunk-samples 32 -T 1
expect_exit 0 "$D" ds_npy z2 --compress zstd:3 --chunk-samples 32 -T 2
expect_same z1/train_x.zst z2/train_x.zst
CHECKS=$((CHECKS + 1))
zstd -q -d -c z1/train_x.zst >zx.raw 2>"$ERR" || fail "zstd -d failed on our chunk frames"
tail -c $((300 * 60)) ds_npy/train_x.npy >ref.raw
expect_same zx.raw ref.raw

# ---- dtype conversion and its report -------------------------------------
expect_exit 0 "$D" ds_npy f32 --dtype f32 --scale 0.00392156862745098 --report-json rep.json
expect_stderr "u8 -> f32"
expect_exit 0 "$D" f32 bf --dtype bf16 --json
expect_stdout '"max_abs_error"'
expect_exit 2 "$D" f32 u8 --dtype u8
expect_stderr "explicit mapping"
expect_exit 0 "$D" f32 u8 --dtype u8 --range 0:1
expect_true "f32 -> u8 with --range 0:1 restores the u8 data; report written" "$PY" -c '
import numpy as np, json
assert (np.load("u8/train_x.npy") == np.load("ref_x.npy")).all()
r = json.load(open("rep.json")); f = r["fields"][0]["conversion"]
assert r["fields"][0]["to"] == "f32" and f["max_abs_error"] < 1e-7 and f["bytes_out"] == 4 * f["bytes_in"]
'

# ---- shuffle and split: deterministic, a permutation, x and y kept together
expect_exit 0 "$D" ds_plain s1 --shuffle 5 --split train=0.75,val=0.25 -T 1
expect_exit 0 "$D" ds_plain s2 --shuffle 5 --split train=0.75,val=0.25 -T 2 --compress zstd:1
expect_true "shuffled copy is a permutation with labels attached" "$PY" -c '
import numpy as np
x = np.load("ref_x.npy"); y = np.load("ref_y.npy")
sx = np.concatenate([np.load("s1/train_x.npy"), np.load("s1/val_x.npy")])
sy = np.concatenate([np.load("s1/train_y.npy"), np.load("s1/val_y.npy")])
assert len(np.load("s1/train_x.npy")) == 225 and len(sx) == 300
assert not (sx == x).all()
key = lambda a, b: sorted((bytes(r), int(l)) for r, l in zip(a.reshape(len(a), -1), b))
assert key(sx, sy) == key(x, y)
'
expect_exit 0 "$D" s2 s2n
expect_same s1/train_x.npy s2n/train_x.npy

# ---- the real MNIST test set ---------------------------------------------
if [ -n "$SHARED" ] && [ -f "$SHARED/data/mnist/t10k-images-idx3-ubyte.gz" ]; then
    expect_exit 0 "$D" "$SHARED/data/mnist" mnist --compress zstd
    expect_exit 0 "$D" mnist mnist_npy
    expect_true "MNIST: 10000 samples, first label 7, pixel sums match the source" "$PY" -c '
import numpy as np, gzip, json, sys
src = sys.argv[1]
img = np.frombuffer(gzip.open(src + "/t10k-images-idx3-ubyte.gz").read()[16:], np.uint8).reshape(-1, 28, 28)
lab = np.frombuffer(gzip.open(src + "/t10k-labels-idx1-ubyte.gz").read()[8:], np.uint8)
x = np.load("mnist_npy/test_x.npy"); y = np.load("mnist_npy/test_y.npy")
m = json.load(open("mnist/dataset.json"))
assert m["splits"][0]["samples"] == 10000 and m["num_classes"] == 10
assert x.shape == (10000, 1, 28, 28) and y[0] == 7 == lab[0]
assert x.sum(dtype=np.int64) == img.sum(dtype=np.int64) and (x.reshape(-1, 28, 28).sum(axis=(1, 2)) == img.sum(axis=(1, 2), dtype=np.int64)).all()
assert (y == lab).all()
' "$SHARED/data/mnist"
    # IDX from stdin.
    CHECKS=$((CHECKS + 1))
    gzip -dc "$SHARED/data/mnist/t10k-images-idx3-ubyte.gz" | "$D" - stdin_x.npy --from idx 2>"$ERR" || fail "IDX from stdin"
    CHECKS=$((CHECKS + 1))
    cmp -s stdin_x.npy mnist_npy/test_x.npy || fail "IDX from stdin differs from the directory import"
    # A gzip stream cut short.
    mkdir -p cut && head -c 500000 "$SHARED/data/mnist/t10k-images-idx3-ubyte.gz" >cut/t10k-images-idx3-ubyte.gz
    expect_exit 1 "$D" cut cut_out
    expect_stderr "t10k-images-idx3-ubyte.gz"
    expect_no_file cut_out
else
    echo "note: no shared MNIST data; MNIST checks skipped" >&2
fi

# ---- CIFAR-10 binary batches ---------------------------------------------
mkdir -p cifar
"$PY" - <<'PY'
import numpy as np
rng = np.random.default_rng(2)
for name, n in (("data_batch_1.bin", 30), ("data_batch_2.bin", 20), ("test_batch.bin", 10)):
    rec = rng.integers(0, 256, size=(n, 3073), dtype=np.uint8)
    rec[:, 0] = np.arange(n) % 10
    rec.tofile("cifar/" + name)
PY
expect_exit 0 "$D" cifar cif
expect_true "CIFAR-10: 50 train, 10 test, labels and pixels split" "$PY" -c '
import numpy as np
rec = np.concatenate([np.fromfile("cifar/data_batch_1.bin", np.uint8).reshape(-1, 3073),
                      np.fromfile("cifar/data_batch_2.bin", np.uint8).reshape(-1, 3073)])
x = np.load("cif/train_x.npy"); y = np.load("cif/train_y.npy")
assert x.shape == (50, 3, 32, 32) and y.dtype == np.int32
assert (y == rec[:, 0]).all() and (x.reshape(50, -1) == rec[:, 1:]).all()
assert np.load("cif/test_x.npy").shape == (10, 3, 32, 32)
'

# ---- raw in and out, feature-major both ways ------------------------------
expect_exit 2 "$D" ref.raw r1 --from raw
expect_stderr "--shape"
expect_exit 0 "$D" ref.raw r1 --from raw --shape 3x4x5 --in-dtype u8
expect_same r1/train_x.npy ds_npy/train_x.npy
expect_exit 0 "$D" r1 fm.raw --to raw --out-layout feature-major
expect_exit 0 "$D" fm.raw r2 --from raw --shape 3x4x5 --in-dtype u8 --layout feature-major
expect_same r2/train_x.npy ds_npy/train_x.npy
expect_true "feature-major raw is the transpose" "$PY" -c '
import numpy as np
x = np.load("ref_x.npy").reshape(300, -1)
assert (np.fromfile("fm.raw", np.uint8).reshape(60, 300) == x.T).all()
'
head -c 1001 ref.raw >odd.raw
expect_exit 1 "$D" odd.raw r3 --from raw --shape 3x4x5 --in-dtype u8
expect_stderr "not a whole number"

# ---- v28b (dsgen --layout feature-major) ----------------------------------------
if [ -x "$BIN/dsgen" ]; then
    expect_exit 0 "$BIN/dsgen" gen --train 300 --test 100 --shape 2x3x4 --kind tabular --dtype f32 --layout feature-major -q
    mkdir -p v28 && mv gen/images_*.bin gen/labels_*.bin v28/ 2>/dev/null
    expect_exit 0 "$D" v28 vds --shape 2x3x4
    expect_same vds/train_x.npy gen/train_x.npy
    expect_same vds/test_y.npy gen/test_y.npy
fi

# ---- corrupted inputs: clear error naming the file, exit 1, no output -------
head -c 2000 x.npy >trunc.npy
expect_exit 1 "$D" trunc.npy o_trunc
expect_stderr "trunc.npy"
expect_no_file o_trunc
printf 'not an npy file at all, no magic here.....' >bad.npy
expect_exit 1 "$D" bad.npy o_bad
expect_stderr "bad.npy"
printf '\x00\x00\x08\x03\x00\x00\x00\x10\x00\x00\x00\x02\x00\x00\x00\x02abc' >short.idx
expect_exit 1 "$D" short.idx o_idx
expect_stderr "short.idx"
printf '\x01\x02\x08\x03rest' >magic.idx
expect_exit 1 "$D" magic.idx o_idx --from idx
expect_stderr "wrong magic"
head -c 3000 deflated.npz >cut.npz
expect_exit 1 "$D" cut.npz o_npz
expect_stderr "cut.npz"
cp -r z1 zbad
"$PY" -c '
import json
m = json.load(open("zbad/dataset.json"))
f = [f for f in m["splits"][0]["fields"] if f["name"] == "x"][0]
b = bytearray(open("zbad/" + f["file"], "rb").read())
b[200] ^= 0xFF  # inside chunk 0 (the header is 40 bytes)
open("zbad/" + f["file"], "wb").write(bytes(b))
'
expect_exit 1 "$D" --verify zbad
expect_stderr "chunk 0 of"
expect_exit 1 "$D" zbad o_zbad
expect_stderr "chunk 0 of"
expect_no_file o_zbad
no_leftovers .

# ---- --resume: killed hard mid-way, rerun continues and gives the same bytes
head -c 24000000 /dev/urandom >res.raw
expect_exit 0 "$D" res.raw res_ref --from raw --shape 1000 --in-dtype u8 --compress zstd:15 --chunk-samples 250 --split a=0.5,b=0.5
"$D" res.raw res_out --from raw --shape 1000 --in-dtype u8 --compress zstd:15 --chunk-samples 250 --split a=0.5,b=0.5 \
    --resume -T 1 -q 2>/dev/null &
pid=$!
for _ in $(seq 600); do # until the first batch of chunks is on disk
    [ "$(stat -c %s .res_out.partial/a_x.zst 2>/dev/null || echo 0)" -gt 100000 ] && break
    sleep 0.05
done
kill -KILL $pid 2>/dev/null
wait $pid 2>/dev/null
CHECKS=$((CHECKS + 1))
if [ -e res_out ]; then
    echo "note: the conversion finished before it could be killed; resume not exercised" >&2
else
    [ -f .res_out.partial/resume.json ] || fail "--resume left no partial directory"
    expect_exit 2 "$D" res.raw res_out --from raw --shape 1000 --in-dtype u8 --compress zstd:9 --resume
    expect_stderr "different settings"
    expect_exit 0 "$D" res.raw res_out --from raw --shape 1000 --in-dtype u8 --compress zstd:15 --chunk-samples 250 \
        --split a=0.5,b=0.5 --resume --json
    expect_stdout '"resumed_after_samples": [1-9]'
    expect_same res_out/a_x.zst res_ref/a_x.zst
    expect_same res_out/b_x.zst res_ref/b_x.zst
    expect_no_file .res_out.partial
fi

# ---- --resume with npy storage: killed hard mid-way, same bytes after the rerun
head -c 48000000 /dev/urandom >resn.raw
resn_args=(resn.raw --from raw --shape 500 --in-dtype f32 --dtype f16 --scale 1e-30 --split a=0.6,b=0.4)
expect_exit 0 "$D" "${resn_args[@]}" resn_ref
"$D" "${resn_args[@]}" resn_out --resume -T 1 -q 2>/dev/null &
pid=$!
for _ in $(seq 600); do # until part of split a is on disk
    [ "$(stat -c %s .resn_out.partial/a_x.npy 2>/dev/null || echo 0)" -gt 2000000 ] && break
    sleep 0.02
done
kill -KILL $pid 2>/dev/null
wait $pid 2>/dev/null
CHECKS=$((CHECKS + 1))
if [ -e resn_out ]; then
    echo "note: the npy conversion finished before it could be killed; npy resume not exercised" >&2
else
    [ -f .resn_out.partial/resume.json ] || fail "--resume (npy) left no partial directory"
    expect_exit 0 "$D" "${resn_args[@]}" resn_out --resume --json
    expect_stdout '"resumed_after_samples": [1-9]'
    for f in a_x.npy b_x.npy; do expect_same "resn_out/$f" "resn_ref/$f"; done
    expect_exit 0 "$D" --verify resn_out
    expect_no_file .resn_out.partial
fi

# ---- overwrite, disk full, Ctrl-C -------------------------------------------
expect_exit 2 "$D" x.npy ds_npy
expect_stderr "already exists"
expect_exit 0 "$D" x.npy ds_npy --force
mkdir -p small
if mount -t tmpfs -o size=1m tmpfs small 2>/dev/null; then
    head -c 3000000 /dev/urandom >big.raw
    expect_exit 3 "$D" big.raw small/o --from raw --shape 1000 --in-dtype u8
    expect_stderr "not enough free disk"
    # --force skips the check: the write itself hits ENOSPC (exit 3: a resource is missing).
    expect_exit 3 "$D" big.raw small/o --from raw --shape 1000 --in-dtype u8 --force
    expect_stderr "No space left on device"
    expect_no_file small/o
    expect_true "temporary files removed after disk full" test -z "$(ls -A small)"
    umount small
else
    echo "note: cannot mount a small tmpfs here; disk-full checks skipped" >&2
fi
head -c 40000000 /dev/urandom >int.raw
CHECKS=$((CHECKS + 1))
"$D" int.raw int_out --from raw --shape 1000 --in-dtype u8 --compress zstd:19 -T 1 2>"$ERR" &
pid=$!
sleep 1
kill -TERM $pid # cleans up as Ctrl-C does, exits 128 + 15
wait $pid
rc=$?
[ "$rc" -eq 143 ] || fail "SIGTERM exit code $rc, expected 143"
expect_no_file int_out
no_leftovers .
# Nothing but a regular file or a directory is ever replaced, --force or not.
echo keep >target.txt
ln -s target.txt link.npy
expect_exit 2 "$D" x.npy link.npy --force
expect_stderr "not a regular file or directory"
expect_true "the symlink is kept" test -L link.npy
expect_true "its target is untouched" grep -q keep target.txt

# --force replaces a dataset, not any directory.
mkdir -p notds && echo mine >notds/keep
expect_exit 2 "$D" x.npy notds --force
expect_stderr "is a directory but not a dataset"
expect_file notds/keep

finish
