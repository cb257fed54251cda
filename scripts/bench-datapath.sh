#!/usr/bin/env bash
# dstrain's data path on this machine's GPU: samples/s of ref-cnn at batch 256
# with the data in GPU memory (device), streamed through the pinned ring
# (stream) and in managed memory (managed), for u8, bf16 and f32 storage; the
# data is in the page cache. Prints a table, stream as a share of device.
#
#   scripts/bench-datapath.sh [LOG_DIR] [BIN_DIR] [TRAIN_SAMPLES]
#
# Managed runs are skipped when the split exceeds a quarter of free GPU memory
# (managed oversubscription can stall a shared GPU).
set -euo pipefail
LOG=${1:-bench-datapath}
BIN=${2:-build/bin}
TRAIN=${3:-200K}
EPOCHS=${EPOCHS:-3}
ORDER=${ORDER:-chunk}
mkdir -p "$LOG"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dstk-bench-datapath.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
for tool in dsgen dstrain; do
    [ -x "$BIN/$tool" ] || { echo "bench-datapath: no $BIN/$tool (build first)" >&2; exit 2; }
done
"$BIN/dstrain" --help | grep -q -- '--data' || { echo "bench-datapath: dstrain has no --data" >&2; exit 2; }

free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1 || echo 0)
# samples/s of the last epoch in a --log-json file
last_rate() { grep '"event":"epoch"' "$1" | tail -1 | grep -o '"samples_per_second":[0-9.e+]*' | cut -d: -f2; }
last_field() { grep '"event":"epoch"' "$1" | tail -1 | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2; }

printf '%-5s %-8s %12s %9s %10s %10s %10s %10s\n' dtype data samples/s vs-device "read wait" read h2d compute \
    | tee "$LOG/table.txt"
for dtype in u8 bf16 f32; do
    ds="$WORK/ds-$dtype"
    "$BIN/dsgen" "$ds" --train "$TRAIN" --test 10K --shape 3x32x32 --dtype "$dtype" --classes 10 --seed 1 -q \
        >"$LOG/dsgen-$dtype.log" 2>&1
    cat "$ds"/*.npy >/dev/null # into the page cache
    bytes=$(du -sb "$ds" | cut -f1)
    device_rate=""
    for data in device stream managed; do
        if [ "$data" = managed ] && [ $((bytes / 1048576)) -gt $((free_mib / 4)) ]; then
            printf '%-5s %-8s %12s  (split %s MiB > 1/4 of %s MiB free: skipped)\n' "$dtype" "$data" - \
                $((bytes / 1048576)) "$free_mib" | tee -a "$LOG/table.txt"
            continue
        fi
        log="$LOG/$dtype-$data.jsonl"
        if ! "$BIN/dstrain" "$ds" --model ref-cnn --batch 256 --epochs "$EPOCHS" --data "$data" --order "$ORDER" \
            --log-json "$log" --save "$LOG/model-$dtype-$data.safetensors" --force >"$LOG/$dtype-$data.out" 2>"$LOG/$dtype-$data.err"; then
            printf '%-5s %-8s %12s  (failed: %s)\n' "$dtype" "$data" - "$(tail -1 "$LOG/$dtype-$data.err")" \
                | tee -a "$LOG/table.txt"
            continue
        fi
        rate=$(last_rate "$log")
        [ "$data" = device ] && device_rate=$rate
        share=$(awk -v a="$rate" -v b="${device_rate:-0}" 'BEGIN { if (b > 0) printf "%.1f%%", 100 * a / b; else print "-" }')
        printf '%-5s %-8s %12.0f %9s %9.3fs %9.3fs %9.3fs %9.3fs\n' "$dtype" "$data" "$rate" "$share" \
            "$(last_field "$log" read_wait_s)" "$(last_field "$log" read_s)" "$(last_field "$log" h2d_s)" \
            "$(last_field "$log" compute_s)" | tee -a "$LOG/table.txt"
    done
done
