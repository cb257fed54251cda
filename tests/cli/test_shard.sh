#!/usr/bin/env bash
# dsgen/dsconvert --shard I/N and dsconvert --merge on the real binaries: the
# merged parts equal a single run (the same command without --shard) byte for
# byte (samples through a plain conversion back to single files, stats in the
# manifest: dsconvert adds its per-chunk sums in the same rows) for N = 1, 2, 3
# (uneven ranges, a part empty in a small split), both storages, dsconvert
# from a dataset, an .npz and a feature-major input; the errors and their
# exit codes.
. "$(dirname "$0")/lib.sh"
G=$BIN/dsgen
C=$BIN/dsconvert
command -v python3 >/dev/null || skip "python3 is needed to compare manifests"
cd "$WORK" || exit 1

# stats_of DIR: the manifest's stats, class count and every field's stats, as one line.
stats_of() { python3 -c 'import json,sys; m=json.load(open(sys.argv[1]+"/dataset.json")); print(m.get("stats"), m.get("num_classes"), [[f.get("stats") for f in s["fields"]] for s in m["splits"]])' "$1"; }
# same_dataset WHOLE MERGED CONVERT-OPTIONS...: MERGED converted back to single files equals WHOLE's files.
same_dataset() {
    local whole=$1 merged=$2
    shift 2
    rm -rf "$merged.back"
    expect_exit 0 "$C" "$merged" "$merged.back" -q "$@"
    for f in $(cd "$whole" && ls | grep -v dataset.json); do expect_same "$whole/$f" "$merged.back/$f"; done
    expect_true "stats of $merged equal $whole's" test "$(stats_of "$whole")" = "$(stats_of "$merged")"
}

# ---- dsgen: N = 1, 2, 3; u8 images (170-sample chunks) and f32 (512) ------
for spec in "u8 3x64x64" "f32 1x32x32"; do
    set -- $spec
    args=(--train 1100 --test 300 --dtype "$1" --shape "$2" --noise 0.5 --seed 7 -q)
    expect_exit 0 "$G" "g-$1" "${args[@]}"
    for n in 1 2 3; do
        parts=()
        for ((i = 0; i < n; i++)); do
            expect_exit 0 "$G" "g-$1-$i-of-$n" "${args[@]}" --shard "$i/$n" -T $((i + 1))
            parts+=("g-$1-$i-of-$n")
        done
        expect_exit 0 "$C" --merge "${parts[@]}" "g-$1-m$n"
        expect_stderr "merged $n parts .*nothing copied"
        same_dataset "g-$1" "g-$1-m$n"
    done
done
# One part: plain files, the single run's own bytes; the parts stay intact (hard links).
for f in train_x.npy train_y.npy test_x.npy test_y.npy; do expect_same g-u8/$f g-u8-m1/$f; done
expect_true "a part's file is hard-linked, not copied" test "$(stat -c %h g-u8-1-of-3/train_x.npy)" -eq 2
expect_true "ranges are uneven (340, 340, 420 train samples)" \
    test "$(python3 -c 'import json; print([json.load(open("g-u8-%d-of-3/dataset.json" % i))["splits"][0]["samples"] for i in range(3)])')" = "[340, 340, 420]"
expect_exit 0 "$C" --verify g-u8-m3
expect_stdout "OK \(10 files"

# ---- dsconvert from a dataset: zstd and npy storage, the stats carried ----
expect_exit 0 "$C" g-u8 z-whole --compress zstd --chunk-samples 100 -q
for i in 0 1 2; do expect_exit 0 "$C" g-u8 "z-$i" --compress zstd --chunk-samples 100 --shard "$i/3" -q; done
expect_exit 0 "$C" --merge z-0 z-1 z-2 z-m --json
expect_stdout '"parts": 3'
same_dataset z-whole z-m --compress zstd --chunk-samples 100
expect_exit 0 "$C" g-f32 n-whole --dtype bf16 --chunk-samples 200 -q
for i in 0 1; do expect_exit 0 "$C" g-f32 "n-$i" --dtype bf16 --chunk-samples 200 --shard "$i/2" -q; done
expect_exit 0 "$C" --merge n-0 n-1 n-m -q
same_dataset n-whole n-m
# From a merged dataset, sharded again.
for i in 0 1; do expect_exit 0 "$C" z-m "r-$i" --shard "$i/2" -q; done
expect_exit 0 "$C" --merge r-0 r-1 r-m -q
same_dataset g-u8 r-m

# ---- dsconvert from a feature-major input (v28b) -------------------------
expect_exit 0 "$G" v28b --train 700 --test 0 --shape 1x8x8 --dtype f32 --layout feature-major -q
expect_exit 0 "$C" v28b v-whole --from v28b --shape 1x8x8 --chunk-samples 64 -q
for i in 0 1 2; do expect_exit 0 "$C" v28b "v-$i" --from v28b --shape 1x8x8 --chunk-samples 64 --shard "$i/3" -q; done
expect_exit 0 "$C" --merge v-0 v-1 v-2 v-m -q
same_dataset v-whole v-m

# ---- dsconvert from an .npz (classes counted per part: the merge takes the largest)
PY=$(numpy_python)
if [ -n "$PY" ]; then
    "$PY" -c '
import numpy as np
r = np.random.default_rng(3)
y = r.integers(0, 5, 900); y[850] = 8
np.savez("d.npz", x_train=r.random((900, 1, 4, 4), dtype=np.float32), y_train=y)'
    expect_exit 0 "$C" d.npz npz-whole --chunk-samples 100 -q
    for i in 0 1 2; do expect_exit 0 "$C" d.npz "npz-$i" --chunk-samples 100 --shard "$i/3" -q; done
    expect_exit 0 "$C" --merge npz-0 npz-1 npz-2 npz-m -q
    same_dataset npz-whole npz-m
fi

# ---- errors ---------------------------------------------------------------
for bad in 3/3 0/0 1 a/2 -1/2 1/2/3 " 1/2"; do
    expect_exit 2 "$G" bad --train 10 --test 0 --shard "$bad"
    expect_stderr "invalid --shard .*I/N with I counted from 0"
    expect_exit 2 "$C" g-u8 bad --shard "$bad"
    expect_stderr "invalid --shard"
done
expect_no_file bad
expect_exit 2 "$G" bad --train 10 --shard 0/2 --layout feature-major
expect_stderr "--shard writes sample-major parts"
expect_exit 2 "$C" g-u8 bad --shard 0/2 --shuffle 1
expect_stderr "--shard cannot be used here \(--shuffle"
expect_exit 2 "$C" g-u8 bad.npy --select train/x --shard 0/2
expect_stderr "single .npy/raw output"
expect_exit 2 "$C" --merge g-u8-0-of-3 g-u8-2-of-3 bad
expect_stderr "missing part 1/3"
expect_exit 2 "$C" --merge g-u8-1-of-3 g-u8-0-of-3 g-u8-2-of-3 bad
expect_stderr "parts out of order: 'g-u8-1-of-3' is part 1/3 but is given at position 0"
expect_exit 2 "$C" --merge g-u8-0-of-3 g-u8-0-of-3 g-u8-2-of-3 bad
expect_stderr "are both part 0/3"
expect_exit 2 "$C" --merge g-u8-0-of-2 g-u8-1-of-3 bad
expect_stderr "part 1/3 but .* part 0/2"
expect_exit 2 "$C" --merge g-u8-0-of-2 g-f32-1-of-2 bad
expect_stderr "not parts of one dataset"
expect_exit 2 "$C" --merge g-u8 g-u8-1-of-2 bad
expect_stderr "not a --shard output"
expect_exit 2 "$C" --merge g-u8-0-of-2 g-u8-1-of-2 g-u8-m2
expect_stderr "exists"
expect_exit 2 "$C" --merge g-u8-0-of-2 g-u8-1-of-2 bad --dtype f32
expect_stderr "--merge only joins parts"
expect_exit 2 "$C" --merge bad
expect_exit 2 "$C" g-u8 bad --move
expect_stderr "--move goes with --merge"
cp -r g-u8-1-of-2 cut && truncate -s -1 cut/train_x.npy
expect_exit 1 "$C" --merge g-u8-0-of-2 cut bad
expect_stderr "cut/train_x.npy' has .* bytes but 'cut' says"
expect_no_file bad
expect_exit 0 "$C" --merge g-u8-0-of-2 g-u8-1-of-2 g-u8-m2 --force -q
# Another filesystem: no hard link (nor rename) reaches it, and nothing is copied.
if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(stat -c %d /dev/shm)" != "$(stat -c %d .)" ]; then
    other=$(mktemp -d /dev/shm/dstk-shard.XXXXXX)
    expect_exit 1 "$C" --merge g-u8-0-of-2 g-u8-1-of-2 "$other/m"
    expect_stderr "different filesystems, and --merge never copies samples"
    expect_no_file "$other/m"
    rm -rf "$other"
fi

# ---- --move: the parts' files move into OUTPUT, the part directories go ----
cp -r g-u8-0-of-2 mv-0 && cp -r g-u8-1-of-2 mv-1
expect_exit 0 "$C" --merge mv-0 mv-1 mv-m --move
expect_stderr "moved, nothing copied"
expect_no_file mv-0
expect_no_file mv-1
same_dataset g-u8 mv-m
finish
