#!/usr/bin/env bash
# dstrain's data path on the GPU machine, in about 4 minutes:
#  (a) constant GPU memory: ref-cnn at batch 256 in stream mode on datasets of
#      1 GiB, 8 GiB and 32 GiB (u8 3x32x32, generated in /dev/shm, one at a
#      time, deleted after use), a few hundred steps each; the peak GPU memory
#      of each run (dstrain's --log-json gpu_memory_peak) must agree within 1%,
#      and stay at or under the ceiling printed before the first step
#      (memory_ceiling), within 1% of it.
#  (b) stream vs device vs managed samples/s for ref-cnn batch 256, u8, bf16
#      and f32 storage in the page cache (scripts/bench-datapath.sh, short runs).
# Prints a short table last; exit 1 when (a) disagrees by more than 1%, a peak
# exceeds its ceiling or falls more than 1% under it, or a run fails.
#
#   DSTK_BIN=build-gpu/bin scripts/bench-gpu-datapath.sh LOG_DIR
#
# Knobs (environment): SIZES_GIB="1 8 32", STEPS=300, TRAIN=150K, EPOCHS=2,
# SCRATCH=/dev/shm (where the large datasets go; needs 32 GiB free).
set -uo pipefail
LOG=${1:?usage: bench-gpu-datapath.sh LOG_DIR}
BIN=${DSTK_BIN:-build-gpu/bin}
SIZES_GIB=${SIZES_GIB:-1 8 32}
STEPS=${STEPS:-300}
SCRATCH=${SCRATCH:-/dev/shm}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$LOG"
for tool in dsgen dstrain; do
    [ -x "$BIN/$tool" ] || { echo "bench-gpu-datapath: no $BIN/$tool (build first, or set DSTK_BIN)" >&2; exit 2; }
done
"$BIN/dstrain" --help | grep -q -- '--max-steps' || { echo "bench-gpu-datapath: dstrain has no --max-steps" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "bench-gpu-datapath: no nvidia-smi (no GPU here)" >&2; exit 2; }
WORK=$(mktemp -d "$SCRATCH/dstk-gpu-datapath.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
field() { grep '"event":"epoch"' "$1" | tail -1 | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2; }

# ---- (a) constant GPU memory in stream mode ---------------------------------------
sample_bytes=3072 # u8 3x32x32
: >"$LOG/memory.txt"
peaks=()
fail=0
for gib in $SIZES_GIB; do
    n=$((gib * 1073741824 / sample_bytes))
    ds="$WORK/ds-${gib}g"
    t0=$SECONDS
    if ! "$BIN/dsgen" "$ds" --train "$n" --test 2560 --shape 3x32x32 --dtype u8 --kind bytes --classes 10 --seed 1 \
        -q >"$LOG/memory-dsgen-${gib}g.log" 2>&1; then
        echo "bench-gpu-datapath: dsgen of $gib GiB failed: $(tail -1 "$LOG/memory-dsgen-${gib}g.log")" >&2
        rm -rf "$ds"
        fail=1
        continue
    fi
    gen_s=$((SECONDS - t0))
    log="$LOG/memory-${gib}g.jsonl"
    rm -f "$log"
    t0=$SECONDS
    if ! "$BIN/dstrain" "$ds" --model ref-cnn --batch 256 --epochs 1 --data stream --order chunk \
        --max-steps "$STEPS" --log-json "$log" --save "$LOG/model-${gib}g.safetensors" --force >"$LOG/memory-${gib}g.out" 2>"$LOG/memory-${gib}g.err"; then
        echo "bench-gpu-datapath: stream run on $gib GiB failed: $(tail -1 "$LOG/memory-${gib}g.err")" >&2
        rm -rf "$ds"
        fail=1
        continue
    fi
    rm -rf "$ds"
    peak=$(field "$log" gpu_memory_peak)
    ceiling=$(field "$log" memory_ceiling)
    rate=$(field "$log" samples_per_second)
    peaks+=("$peak")
    overhead=$(grep '"event":"memory"' "$log" | tail -1 | grep -o '"runtime_overhead":[0-9]*' | cut -d: -f2)
    bound=$(awk -v p="$peak" -v c="$ceiling" 'BEGIN {
        if (p > c) print "OVER the ceiling"; else if (p < 0.99 * c) print "more than 1% UNDER the ceiling";
        else print "ok" }')
    [ "$bound" = ok ] || fail=1
    printf '%4s GiB %10s samples  peak GPU memory %8.1f MiB  ceiling %8.1f MiB (runtime overhead %6.1f MiB)  %s  %8.0f samples/s  (dsgen %ss, train %ss)\n' \
        "$gib" "$n" "$(awk -v b="$peak" 'BEGIN { print b / 1048576 }')" \
        "$(awk -v b="$ceiling" 'BEGIN { print b / 1048576 }')" "$(awk -v b="${overhead:-0}" 'BEGIN { print b / 1048576 }')" \
        "$bound" "$rate" "$gen_s" $((SECONDS - t0)) |
        tee -a "$LOG/memory.txt"
done
verdict="no runs"
if [ ${#peaks[@]} -gt 0 ]; then
    verdict=$(printf '%s\n' "${peaks[@]}" | awk '
        NR == 1 { lo = $1; hi = $1 } { if ($1 < lo) lo = $1; if ($1 > hi) hi = $1 }
        END { spread = lo > 0 ? 100 * (hi - lo) / lo : 100
              printf "%s: peaks within %.2f%% of each other over %d datasets", (spread <= 1 ? "agree within 1%" : "DISAGREE by more than 1%"), spread, NR }')
    case $verdict in DISAGREE*) fail=1 ;; esac
    [ ${#peaks[@]} -eq $(echo $SIZES_GIB | wc -w) ] || fail=1
fi
echo "$verdict" | tee -a "$LOG/memory.txt"
echo "bench-gpu-datapath: (a) done after $((SECONDS - START))s" >&2

# ---- (b) stream vs device vs managed ----------------------------------------------
EPOCHS=${EPOCHS:-2} TMPDIR="$WORK" "$HERE/bench-datapath.sh" "$LOG/placements" "$BIN" "${TRAIN:-150K}" \
    >"$LOG/placements.out" 2>"$LOG/placements.err" || fail=1
echo "bench-gpu-datapath: (b) done after $((SECONDS - START))s" >&2

echo
echo "== constant GPU memory: ref-cnn b256, stream, u8 3x32x32, $STEPS steps each"
cat "$LOG/memory.txt"
echo "== samples/s by placement: ref-cnn b256, data in the page cache, ${EPOCHS:-2} epochs of ${TRAIN:-150K} (last epoch)"
cat "$LOG/placements/table.txt" 2>/dev/null || echo "(no table: see $LOG/placements.err)"
exit $fail
