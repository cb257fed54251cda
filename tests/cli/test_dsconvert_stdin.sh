#!/usr/bin/env bash
# dsconvert reading stdin ('-'): raw samples of unknown count, IDX plain or
# gzipped, labels from --labels; same bytes as converting the file, clear
# errors for cut-short pipes, Ctrl-C while the pipe is silent.
. "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
cd "$WORK"

# from_pipe CODE FILE cmd...: expect_exit with FILE sent through a pipe (no size, no seek).
from_pipe() {
    local want=$1 file=$2
    shift 2
    CHECKS=$((CHECKS + 1))
    cat "$file" | "$@" >"$OUT" 2>"$ERR"
    local got=${PIPESTATUS[1]}
    [ "$got" -eq "$want" ] || fail "exit $got, expected $want: $* < $file"
    return 0
}
# idx_labels FILE N: an IDX label file of N labels (i % 10).
idx_labels() {
    {
        printf '\x00\x00\x08\x01'
        printf "\\x$(printf %02x $(($2 >> 24 & 255)))\\x$(printf %02x $(($2 >> 16 & 255)))"
        printf "\\x$(printf %02x $(($2 >> 8 & 255)))\\x$(printf %02x $(($2 & 255)))"
        for ((i = 0; i < $2; i++)); do printf "\\x0$((i % 10))"; done
    } >"$1"
}

# 700 samples of 3x8x8 u8.
head -c $((700 * 192)) /dev/urandom >x.raw
RAW=(--from raw --shape 3x8x8 --in-dtype u8)

# ---- raw stdin == the same file -----------------------------------------
expect_exit 0 "$D" x.raw f.npy "${RAW[@]}" --dtype f32 --scale 0.5
from_pipe 0 x.raw "$D" - s.npy "${RAW[@]}" --dtype f32 --scale 0.5
expect_same f.npy s.npy
expect_stderr "700 samples"
# --shape on stdin means raw without --from.
from_pipe 0 x.raw "$D" - s2.npy --shape 3x8x8 --in-dtype u8 --dtype f32 --scale 0.5
expect_same f.npy s2.npy
for c in none zstd:1; do
    expect_exit 0 "$D" x.raw f_$c "${RAW[@]}" --compress $c --chunk-samples 64
    from_pipe 0 x.raw "$D" - s_$c "${RAW[@]}" --compress $c --chunk-samples 64
    ext=$([ $c = none ] && echo npy || echo zst)
    expect_same f_$c/train_x.$ext s_$c/train_x.$ext
    expect_exit 0 "$D" --verify s_$c
done
expect_true "manifest counts 700 samples" grep -q '"samples": 700' s_none/dataset.json
# A raw output.
from_pipe 0 x.raw "$D" - s.raw "${RAW[@]}" --to raw
expect_same x.raw s.raw
PY=$(numpy_python)
if [ -n "$PY" ]; then
    expect_true "numpy reads the stdin .npy" "$PY" -c "import numpy as np; a = np.load('s.npy'); assert a.shape == (700, 3, 8, 8), a.shape"
fi

# ---- pipes that end badly, options that need the count -------------------
head -c $((10 * 192 + 5)) x.raw >cut.raw
from_pipe 1 cut.raw "$D" - cut.npy "${RAW[@]}"
expect_stderr "<stdin>: ends inside sample 10 \(5 of its 192 bytes"
expect_no_file cut.npy
: >empty.raw
from_pipe 1 empty.raw "$D" - empty_out "${RAW[@]}"
expect_stderr "no samples"
expect_no_file empty_out
for opt in "--shuffle 1" "--split train=0.5,test=0.5" "--resume"; do
    # shellcheck disable=SC2086
    from_pipe 2 x.raw "$D" - o "${RAW[@]}" $opt
    expect_stderr "needs the sample count"
done
from_pipe 2 x.raw "$D" - o.raw "${RAW[@]}" --to raw --out-layout feature-major
expect_stderr "feature-major output needs the sample count"
from_pipe 2 x.raw "$D" - o "${RAW[@]}" --layout feature-major
from_pipe 2 x.raw "$D" - o "${RAW[@]}" --range auto
expect_no_file o

# ---- --labels -------------------------------------------------------------
idx_labels lab700 700
idx_labels lab600 600
from_pipe 0 x.raw "$D" - l "${RAW[@]}" --labels lab700
expect_true "labels give field y" grep -q '"train_y.npy"' l/dataset.json
expect_exit 0 "$D" x.raw lf "${RAW[@]}" --labels lab700
expect_same l/train_x.npy lf/train_x.npy
expect_same l/train_y.npy lf/train_y.npy
from_pipe 1 x.raw "$D" - l2 "${RAW[@]}" --labels lab600
expect_stderr "holds more data than the 600 samples the labels give"
expect_no_file l2
head -c $((650 * 192)) x.raw >short.raw
from_pipe 1 short.raw "$D" - l2 "${RAW[@]}" --labels lab700
expect_stderr "ends after 650 samples"
expect_exit 1 "$D" x.raw l2 "${RAW[@]}" --labels lab600
expect_stderr "600 labels but the images have 700"
expect_no_file l2

# ---- IDX from stdin, plain and gzipped (the real MNIST test set) -----------
MN=${SHARED:+$SHARED/data/mnist}
if [ -n "$MN" ] && [ -f "$MN/t10k-images-idx3-ubyte.gz" ]; then
    expect_exit 0 "$D" "$MN" mnist
    gzip -dc "$MN/t10k-images-idx3-ubyte.gz" >images.idx
    from_pipe 0 "$MN/t10k-images-idx3-ubyte.gz" "$D" - z --labels "$MN/t10k-labels-idx1-ubyte.gz"
    expect_same z/test_x.npy mnist/test_x.npy
    expect_same z/test_y.npy mnist/test_y.npy
    expect_true "num_classes from the labels" grep -q '"num_classes": 10' z/dataset.json
    from_pipe 0 images.idx "$D" - p --labels "$MN/t10k-labels-idx1-ubyte.gz" --compress zstd
    expect_exit 0 "$D" --verify p
    head -c 3000000 images.idx >cut.idx
    from_pipe 1 cut.idx "$D" - c --labels "$MN/t10k-labels-idx1-ubyte.gz"
    expect_stderr "<stdin>: ends early"
    expect_no_file c
    from_pipe 2 images.idx "$D" - c --labels "$MN/t10k-labels-idx1-ubyte.gz" --from npy
else
    echo "note: $MN/t10k-images-idx3-ubyte.gz absent: the MNIST stdin checks are skipped" >&2
fi

# ---- Ctrl-C while the pipe is silent ---------------------------------------
mkfifo fifo
"$D" - sig "${RAW[@]}" <fifo 2>"$ERR" &
pid=$!
exec 3>fifo # the writer stays open and silent
head -c $((5 * 192)) x.raw >&3
sleep 1
kill -INT "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    fail "dsconvert did not stop within 5 s of SIGINT while reading a silent pipe"
fi
wait "$pid"
rc=$?
exec 3>&-
expect_true "SIGINT exits 130 (got $rc)" [ "$rc" -eq 130 ]
expect_no_file sig
expect_true "no temporary output left" [ -z "$(find . -maxdepth 1 -name '.sig*')" ]


# ---- --resume from stdin with --labels: killed hard while the pipe is silent,
# the rerun (the same bytes piped again) skips what is on disk and gives the
# same bytes. A chunk batch (16,750 samples of 1000 B here) reaches the disk
# once the next one is under way, and the labels' batches follow the images'.
{
    printf '\x00\x00\x08\x01\x00\x00\xea\x60' # 60000 labels
    printf '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09%.0s' $(seq 6000)
} >res_lab
head -c 60000000 /dev/urandom >res.raw
RES=(--shape 1000 --in-dtype u8 --compress zstd:15 --chunk-samples 250 --labels res_lab)
expect_exit 0 "$D" res.raw res_ref --from raw "${RES[@]}"
mkfifo res.pipe
{
    head -c 50000000 res.raw
    for _ in $(seq 300); do # silent until told to stop (or 30 s)
        [ -e res.stop ] && exit 0
        sleep 0.1
    done
    tail -c +50000001 res.raw
} >res.pipe 2>/dev/null &
producer=$!
"$D" - res_out "${RES[@]}" --resume -T 1 -q <res.pipe 2>/dev/null &
pid=$!
for _ in $(seq 300); do # until the first batch of labels is on disk too
    [ "$(stat -c %s .res_out.partial/train_y.zst 2>/dev/null || echo 0)" -gt 1000 ] && break
    sleep 0.05
done
kill -KILL $pid 2>/dev/null
touch res.stop
wait $pid $producer 2>/dev/null
CHECKS=$((CHECKS + 1))
[ -e res_out ] && fail "the stdin conversion finished while its pipe was silent"
[ -f .res_out.partial/resume.json ] || fail "--resume from stdin left no partial directory"
from_pipe 0 res.raw "$D" - res_out "${RES[@]}" --resume --json
expect_stdout '"resumed_after_samples": 16750'
expect_same res_out/train_x.zst res_ref/train_x.zst
expect_same res_out/train_y.zst res_ref/train_y.zst
expect_no_file .res_out.partial
# The statistics count the samples of the interrupted run too (u8 sums are exact).
stats_of() { python3 -c 'import json,sys; m=json.load(open(sys.argv[1]+"/dataset.json")); print(m["splits"][0]["fields"][0]["stats"])' "$1"; }
expect_true "statistics of the resumed run equal the single run's" test "$(stats_of res_out)" = "$(stats_of res_ref)"

finish
