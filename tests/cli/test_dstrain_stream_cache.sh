#!/usr/bin/env bash
# dstrain --data stream reads whole chunks into its window cache: through
# --log-json's counters, every read of the input is a whole chunk (the last may
# be shorter), each chunk is read once per epoch, and the batches (an XXH64 of
# their bytes and labels, per epoch) are those of --data device. The host
# ceiling and the peak RSS are in every epoch line and JSON line; a --host-mem
# below two windows is refused (exit 3). On the CPU the ceiling is measured
# after a warm-up step: a convolutional run's peak RSS lands on it (within 3%
# under, 2% over), neither counting the trainer's buffers twice nor missing its
# threads' scratch.
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"
command -v jq >/dev/null || skip "no jq"

# 5000 samples of 192 bytes, chunks of 256 samples (48 KiB): 20 chunks, the last of 136.
"$DSGEN" "$WORK/ds" --train 5000 --test 300 --shape 3x8x8 --classes 4 --seed 5 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
BASE=(--model mlp --device cpu -T 2 --seed 1 --epochs 2 --batch 64 --chunk-samples 256 --window 3)

for order in chunk sequential; do
    expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --order "$order" --data stream --host-mem 1M --log-json "$WORK/s.jsonl" --force
    expect_stdout '^epoch 2/2 .*host RSS [0-9.]+ [KMG]iB \(ceiling [0-9.]+ [KMG]iB\)'
    expect_stderr 'host memory ceiling .*--host-mem 1\.0 MiB'
    expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --order "$order" --data device --log-json "$WORK/d.jsonl" --force
    for e in 1 2; do
        s=$(jq -c "select(.event == \"epoch\" and .epoch == $e)" "$WORK/s.jsonl")
        d=$(jq -c "select(.event == \"epoch\" and .epoch == $e)" "$WORK/d.jsonl")
        expect_true "$order epoch $e: stream and device batches hash alike" \
            test "$(jq .stages.batch_hash <<<"$s")" = "$(jq .stages.batch_hash <<<"$d")"
        expect_true "$order epoch $e: a batch hash" test "$(jq '.stages.batch_hash | type' <<<"$s")" = '"number"'
        expect_true "$order epoch $e: 20 chunk reads" test "$(jq .stages.reads <<<"$s")" = 20
        expect_true "$order epoch $e: reads of whole chunks (256 x 192 bytes)" \
            test "$(jq .stages.read_largest <<<"$s")" = 49152
        expect_true "$order epoch $e: only the last chunk is shorter (136 samples)" \
            test "$(jq .stages.read_smallest <<<"$s")" = 26112
        expect_true "$order epoch $e: the split read once" test "$(jq .stages.read_bytes <<<"$s")" = 960000
        expect_true "$order epoch $e: peak RSS and host ceiling in JSON" \
            test "$(jq '(.host_peak_rss > 0) and (.host_ceiling > 0)' <<<"$s")" = true
    done
done

"$DSGEN" "$WORK/img" --train 2000 --test 300 --shape 3x16x16 --classes 4 --seed 5 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
expect_exit 0 "$DSTRAIN" "$WORK/img" --model small-cnn --device cpu -T 2 --seed 1 --epochs 2 --batch 128 \
    --log-json "$WORK/c.jsonl" --force
expect_true "cpu: peak RSS within 3% under and 2% over the host ceiling" test "$(jq -s \
    '[.[] | select(.event == "epoch") | .host_peak_rss / .host_ceiling | (. >= 0.97 and . <= 1.02)] | all' \
    "$WORK/c.jsonl")" = true

# The full order reads single samples (the figure the window cache avoids).
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --order full --data stream --log-json "$WORK/f.jsonl"
expect_true "full order: sample-sized reads" \
    test "$(jq -s '[.[] | select(.event == "epoch")][0].stages.read_smallest' "$WORK/f.jsonl")" = 192

# Two windows of 3 chunks of 48 KiB do not fit in 64 KiB.
expect_exit 3 "$DSTRAIN" "$WORK/ds" "${BASE[@]}" --data stream --host-mem 64K
expect_stderr 'host-mem .* (below|leaves nothing)'
finish
