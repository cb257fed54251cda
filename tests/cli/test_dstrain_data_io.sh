#!/usr/bin/env bash
# dstrain's stream reads on the cpu: --bench FILE picks --prefetch/--readers
# from dsbench's figures (explicit options win); --direct (O_DIRECT) trains
# exactly as the page cache does; zstd-chunked storage (dsconvert --compress
# zstd) trains exactly as .npy storage does; a corrupted chunk frame is an
# error naming the file and chunk, exit 1, with the last checkpoint kept.
# Also dsbench's loader cases (--list, a CPU-side run).
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
DSCONVERT="$BIN/dsconvert"
DSBENCH="$BIN/dsbench"
for b in "$DSTRAIN" "$DSGEN" "$DSCONVERT" "$DSBENCH"; do [ -x "$b" ] || skip "no $(basename "$b") binary in $BIN"; done
"$DSTRAIN" --help | grep -q -- "--direct" || skip "this dstrain has no --direct (data path options not wired in)"
command -v jq >/dev/null || skip "jq is needed to read dsbench's JSON"
command -v python3 >/dev/null || skip "python3 is needed to corrupt a chunk frame"

"$DSGEN" "$WORK/ds" --train 3000 --test 500 --shape 1x12x12 --classes 4 --seed 3 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
BASE=(--model small-cnn --device cpu -T 2 --seed 1 --epochs 2 --batch 50 --save "$WORK/model.safetensors" --force)
# The figures of a run: "loss ... test acc ..." of each epoch (no timings).
figures() { grep -o 'loss [0-9.]*  train acc [0-9.]*%  test acc [0-9.]*%' "$OUT"; }

# ---- dsbench loader cases --------------------------------------------------
expect_exit 0 "$DSBENCH" --list
expect_stdout '^loader\.stream\.chunk '
expect_stdout '^loader\.device\.full '
expect_stdout '^loader\.managed\.sequential '
expect_exit 0 "$DSBENCH" all "$WORK/ds" --cases loader.stream,loader.device.sequential --repetitions 2 --min-time 0 \
    --batch 64 --json "$WORK/loader.json" -q
expect_true "7 loader results, all ok with rate and samples_rate" test "$(jq '[.results[] | select(.status == "ok" and
    .metrics.samples_rate.median > 0 and .metrics.rate.median > 0)] | length' "$WORK/loader.json")" = 7
# Every batch is read once: no figure beyond what memory can move (1 TB/s).
expect_true "loader rates are rates of real work" test "$(jq '[.results[] | select(.metrics.rate.median > 1e12)]
    | length' "$WORK/loader.json")" = 0

# ---- --bench -----------------------------------------------------------------
expect_exit 0 "$DSBENCH" all "$WORK/ds" --cases 'io.rand.chunk.pread.cold,io.seq.pread.cold' --threads 1,3 \
    --repetitions 2 --min-time 0 --size 256K --chunk-size 64K --json "$WORK/bench.json" -q
best=$(jq -r '[.results[] | select(.case == "io.rand.chunk.pread.cold" and .status == "ok")]
    | max_by(.metrics.rate.median) | .params.threads' "$WORK/bench.json")
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --data stream --order chunk --bench "$WORK/bench.json"
# The reader count is capped at the hardware threads (CI machines have 2).
cores=$(nproc)
readers=$((best < cores ? best : cores))
expect_stderr "--bench .*bench.json: readers $readers: cold random chunk reads were fastest with $best threads"
expect_stderr "--bench .*: prefetch [0-9]+: $readers readers \+ 2 in use \+ [0-9]+ to cover a p99 read"
expect_stderr 'storage reads .* sequentially'
expect_stdout '^epoch 2/2'
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --data stream --bench "$WORK/bench.json" --readers 3 --prefetch 5
expect_stderr 'readers 3 \(--readers given\)'
expect_stderr 'prefetch 5 \(--prefetch given\)'
expect_stderr 'ceiling .*\(5 batch slots'
expect_exit 1 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --bench "$WORK/missing.json"
expect_stderr 'missing.json'

# ---- --direct: the same training as through the page cache --------------------
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --data stream --order chunk --chunk-samples 100
figures >"$WORK/plain.txt"
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --data stream --order chunk --chunk-samples 100 --direct
figures >"$WORK/direct.txt"
expect_true "two epochs of figures" test "$(wc -l <"$WORK/plain.txt")" = 2
expect_same "$WORK/plain.txt" "$WORK/direct.txt"
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --data device --direct
expect_stderr '--direct applies to --data stream only'

# ---- zstd-chunked storage through the stream path -----------------------------
expect_exit 0 "$DSCONVERT" "$WORK/ds" "$WORK/dsz" --compress zstd --chunk-samples 100 -q
expect_true "dsconvert wrote a zstd-chunked train_x" test "$(jq -r '.splits[] | select(.name == "train")
    | .fields[] | select(.name == "x") | .storage' "$WORK/dsz/dataset.json")" = zstd-chunked
for order in sequential chunk; do
    expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --data stream --order "$order" --chunk-samples 100
    figures >"$WORK/npy-$order.txt"
    expect_exit 0 "$DSTRAIN" "$WORK/dsz" "${BASE[@]}" --data stream --order "$order" --readers 3
    figures >"$WORK/zstd-$order.txt"
    expect_stderr "order $order"
    expect_true "zstd $order: two epochs of figures" test "$(wc -l <"$WORK/zstd-$order.txt")" = 2
    expect_same "$WORK/npy-$order.txt" "$WORK/zstd-$order.txt"
done
# O_DIRECT reads of the frames (or, where the filesystem refuses O_DIRECT, the
# page cache with a notice) train alike.
expect_exit 0 "$DSTRAIN" "$WORK/dsz" "${BASE[@]}" --data stream --direct
figures >"$WORK/zstd-direct.txt"
expect_same "$WORK/npy-chunk.txt" "$WORK/zstd-direct.txt"

# ---- a corrupted chunk frame --------------------------------------------------
cp -r "$WORK/dsz" "$WORK/bad"
xfile=$(jq -r '.splits[] | select(.name == "train") | .fields[] | select(.name == "x") | .file' "$WORK/bad/dataset.json")
# Flip a byte in the middle of chunk 20's frame (samples 2000..2099, step 41 of epoch 1).
python3 - "$WORK/bad/$xfile" 20 <<'PY' || { echo "cannot corrupt the chunk" >&2; exit 1; }
import struct, sys
path, k = sys.argv[1], int(sys.argv[2])
d = bytearray(open(path, "rb").read())
start = len(d) - struct.unpack("<Q", d[-16:-8])[0]
assert d[start + 8:start + 16] == b"DSTKZIDX", "no chunk index where the trailer points"
off, size, _ = struct.unpack("<QQQ", d[start + 48 + 24 * k:start + 72 + 24 * k])
d[off + size // 2] ^= 0x5A
open(path, "wb").write(d)
PY
expect_exit 1 "$DSTRAIN" "$WORK/bad" "${BASE[@]}" --data stream --order sequential --prefetch 2 --readers 1 \
    --checkpoint "$WORK/ck" --checkpoint-every 10
expect_stderr "$xfile.*chunk 20 of 30.*checksum mismatch"
expect_true "a checkpoint from before the bad chunk is kept" test -n "$(ls -A "$WORK/ck" 2>/dev/null)"
# It is a whole checkpoint: the run continues from it on the intact dataset.
expect_exit 0 "$DSTRAIN" "$WORK/dsz" "${BASE[@]}" --data stream --order sequential --checkpoint "$WORK/ck" --resume
expect_stderr 'resumed from .* at epoch 1, batch 40 \(step 40\)'
expect_stdout '^epoch 2/2'
finish
