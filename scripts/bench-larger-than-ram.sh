#!/usr/bin/env bash
# Larger than RAM, at the disk's speed: dstrain's stream placement on datasets
# at least 4x a memory cgroup's limit, on disk (not tmpfs), every file's pages
# evicted before each run. Run as root on the GPU machine (cgroup v2, or v1):
#   scripts/bench-larger-than-ram.sh [BIN_DIR] [LOG_DIR]
# BIN_DIR defaults to build-gpu/bin (scripts/gpu-test.sh builds it, and runs
# this script with DSTK_GPU_BENCH=bench-larger-than-ram); logs go to LOG_DIR
# (default $OUT/ltr, else build-gpu/logs/ltr). Rows, for u8 and f32 storage:
#   device      --data device, outside the cgroup (the reference)
#   chunk       --data stream (chunk order, buffered reads), inside the cgroup
#   direct      --data stream --direct
#   sequential  --data stream --order sequential
#   full        --data stream --order full (capped at FULL_STEPS steps: random reads)
#   zstd        --data stream on a zstd-chunked copy
# Each row is one epoch in a fresh process; columns: samples/s, % of device,
# read wait, peak RSS and the host ceiling dstrain printed (from --log-json).
# The disk's own rates (dsbench cold sequential and random chunk reads, 2 GiB
# a pass so that they are sustained rates as an epoch gets them, and zstd
# decoding) are measured in the same cgroup; "% disk" is a row's input bytes
# per second over the best random-chunk rate, "% 16t" over the rate at the 16
# reads in flight that dstrain's window cache keeps in the chunk order. For
# f32, dsbench's loader.stream.chunk and loader.stream.direct.chunk (the same
# data path, no model) are timed in the cgroup too, beside the disk's rates.
# "predicted" is dsplan's epoch time for the row (--data stream: from disk,
# cold page cache; --bench the disk measurement, --compute-rate the device
# row's samples/s) beside the measured train time, with the error in %
# (target: within 15%), and the stage dsplan says limits beside the one the
# epoch line names; the full-order row (capped by FULL_STEPS) shows "-".
# A short table is printed last, then the prediction check (one line per
# predicted row; CHECK_PREDICTION=1 makes the script exit 1 when one is off
# by more than 15%).
# Environment (defaults sized so that the script takes about 7 minutes):
#   LTR_DIR      data directory on disk (default build-gpu/ltr-data; removed at the end)
#   U8_TRAIN     u8 3x32x32 training samples (default 2800K: 8.6 GB) with U8_LIMIT (default 2G)
#   F32_TRAIN    f32 3x32x32 training samples (default 680K: 8.4 GB) with F32_LIMIT (default 2G)
#   STORAGES     "u8 f32" (default), or one of them
#   ROWS         the rows to run (default all: "device chunk direct sequential full zstd";
#                the device row gives the % of device and dsplan's compute rate)
#   MODEL, PRECISION, BATCH  (ref-cnn, tf32, 256)
#   FULL_STEPS   steps of the full-order row (default 1500)
#   CHECK_PREDICTION  1: exit 1 when a predicted epoch is off by more than 15%
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=$(realpath "${1:-build-gpu/bin}")
log=${2:-${OUT:+$OUT/ltr}}
log=${log:-build-gpu/logs/ltr}
mkdir -p "$log"
log=$(realpath "$log")
data=${LTR_DIR:-$PWD/build-gpu/ltr-data}
model=${MODEL:-ref-cnn}
precision=${PRECISION:-tf32}
batch=${BATCH:-256}
full_steps=${FULL_STEPS:-1500}
storages=${STORAGES:-u8 f32}
rows=${ROWS:-device chunk direct sequential full zstd}

die() { echo "bench-larger-than-ram: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (memory cgroups and dropping the page cache)"
for t in dstrain dsgen dsconvert dsbench dsplan; do [ -x "$bin/$t" ] || die "no $bin/$t (build first: scripts/gpu-test.sh)"; done
command -v jq >/dev/null || die "needs jq"
mkdir -p "$data"
fstype=$(stat -f -c %T "$data")
[ "$fstype" = tmpfs ] && die "$data is on tmpfs: the data must be on disk (set LTR_DIR)"

source "$(dirname "$0")/lib/cgroup.sh"
cgroup_create dstk-ltr
cleanup() {
    cgroup_remove
    [ -z "${LTR_DIR:-}" ] && rm -rf "$data"
}
trap cleanup EXIT

t0=$SECONDS
table="$log/table.txt"
: >"$table"
printf '%-10s %-10s %11s %7s %7s %7s %10s %10s %10s %8s %16s %s\n' storage row samples/s device disk "16t" \
    "read wait" "peak RSS" ceiling epoch "predicted (err)" status >>"$table"
check="$log/prediction.txt"
printf '%-10s %-10s %10s %10s %8s  %-22s %-22s %s\n' storage row predicted measured error "dsplan: limited by" \
    "epoch line: limited by" verdict >"$check"
bad_predictions=0

# predict DATASET ORDER: dsplan's epoch for a stream of DATASET in ORDER from
# disk (cold page cache), from the disk measurement and the device row's rate;
# prints "SECONDS LIMITED_BY", nothing where it has no estimate.
predict() {
    [ "${ref_rate:-0}" = 0 ] && return
    "$bin/dsplan" --dataset "$1" --bench "$log/$storage-disk.json" --data stream --order "$2" --batch "$batch" \
        --compute-rate "$(awk -v r="$ref_rate" 'BEGIN { printf "%.0f", r }')" --json 2>>"$log/dsplan.log" |
        tee "$log/$storage-dsplan-$row.json" |
        jq -r 'select(.epoch.epoch_seconds != null) | "\(.epoch.epoch_seconds) \(.epoch.limited_by)"' 2>/dev/null
}

gib() { awk -v b="$1" 'BEGIN { if (b == "" || b == "null") print "-"; else printf "%.2f GiB", b / 1073741824 }'; }

# run_row STORAGE ROW WHERE DATASET OPTIONS...: one epoch, figures from --log-json.
run_row() {
    local storage=$1 row=$2 where=$3 ds=$4
    shift 4
    local json="$log/$storage-$row.jsonl" rc
    evict "$ds"
    local cmd=("$bin/dstrain" "$ds" --model "$model" --precision "$precision" --batch "$batch" --epochs 1 --seed 1
        --log-json "$json" "$@")
    echo "== $storage $row: ${cmd[*]}" >>"$log/runs.log"
    if [ "$where" = cgroup ]; then in_cgroup "${cmd[@]}" >>"$log/runs.log" 2>&1; else "${cmd[@]}" >>"$log/runs.log" 2>&1; fi
    rc=$?
    local ep rate wait rss ceil secs limited pred="" pred_limited=""
    ep=$(grep '"event":"epoch"' "$json" 2>/dev/null | tail -1)
    rate=$(jq -r '.samples_per_second // empty' <<<"$ep" 2>/dev/null)
    wait=$(jq -r '.stages.read_wait_s // empty' <<<"$ep" 2>/dev/null)
    rss=$(jq -r '.host_peak_rss // empty' <<<"$ep" 2>/dev/null)
    ceil=$(jq -r '.host_ceiling // empty' <<<"$ep" 2>/dev/null)
    secs=$(jq -r '.train_seconds // empty' <<<"$ep" 2>/dev/null)
    limited=$(jq -r '.stages.limited_by // empty' <<<"$ep" 2>/dev/null)
    [ "$row" = device ] && ref_rate=${rate:-0}
    local order=chunk
    [ "$row" = sequential ] && order=sequential
    if [ "$row" != device ] && [ "$row" != full ]; then
        read -r pred pred_limited < <(predict "$ds" "$order")
        pred_limited=${pred_limited:-}
    fi
    local epoch_col="-" pred_col="-"
    [ -n "$secs" ] && epoch_col=$(awk -v s="$secs" 'BEGIN { printf "%.2fs", s }')
    if [ -n "$pred" ] && [ -n "$secs" ]; then
        pred_col=$(awk -v p="$pred" -v s="$secs" 'BEGIN { printf "%.2fs (%+.1f%%)", p, 100 * (p - s) / s }')
        local err verdict=ok
        err=$(awk -v p="$pred" -v s="$secs" 'BEGIN { printf "%+.1f%%", 100 * (p - s) / s }')
        if awk -v p="$pred" -v s="$secs" 'BEGIN { e = (p - s) / s; exit !(e > 0.15 || e < -0.15) }'; then
            verdict="OFF (>15%)"
            bad_predictions=$((bad_predictions + 1))
        fi
        printf '%-10s %-10s %9.2fs %9.2fs %8s  %-22s %-22s %s\n' "$storage" "$row" "$pred" "$secs" "$err" \
            "$pred_limited" "$limited" "$verdict" >>"$check"
    fi
    local pct_dev="-" pct_disk="-" pct_16="-"
    [ -n "$rate" ] && [ "${ref_rate:-0}" != 0 ] && pct_dev=$(awk -v a="$rate" -v b="$ref_rate" 'BEGIN { printf "%.1f%%", 100 * a / b }')
    [ -n "$rate" ] && [ "${disk_rand:-0}" != 0 ] &&
        pct_disk=$(awk -v a="$rate" -v s="$sample_bytes" -v d="$disk_rand" 'BEGIN { printf "%.1f%%", 100 * a * s / d }')
    [ -n "$rate" ] && [ "${disk_rand16:-0}" != 0 ] &&
        pct_16=$(awk -v a="$rate" -v s="$sample_bytes" -v d="$disk_rand16" 'BEGIN { printf "%.1f%%", 100 * a * s / d }')
    printf '%-10s %-10s %11s %7s %7s %7s %10s %10s %10s %8s %16s %s\n' "$storage" "$row" \
        "$(awk -v a="${rate:-0}" 'BEGIN { printf "%.0f", a }')" "$pct_dev" "$pct_disk" "$pct_16" \
        "$(awk -v w="${wait:-0}" 'BEGIN { printf "%.2fs", w }')" "$(gib "$rss")" "$(gib "$ceil")" \
        "$epoch_col" "$pred_col" "$([ $rc = 0 ] && echo ok || echo "rc=$rc")" >>"$table"
}

for storage in $storages; do
    case $storage in
    u8) train=${U8_TRAIN:-2800K} limit=${U8_LIMIT:-2G} dtype=u8 sample_bytes=3072 ;;
    f32) train=${F32_TRAIN:-680K} limit=${F32_LIMIT:-2G} dtype=f32 sample_bytes=12288 ;;
    *) die "unknown storage '$storage' (u8 or f32)" ;;
    esac
    ds="$data/$storage" dsz="$data/$storage-zstd"
    echo "== $storage: dsgen $train samples, then a zstd-chunked copy ($((SECONDS - t0)) s)" >&2
    "$bin/dsgen" "$ds" --train "$train" --test 10K --dtype "$dtype" --force -q >"$log/$storage-dsgen.log" 2>&1 ||
        die "dsgen failed: $log/$storage-dsgen.log"
    "$bin/dsconvert" "$ds" "$dsz" --compress zstd:1 -q >"$log/$storage-dsconvert.log" 2>&1 ||
        die "dsconvert failed: $log/$storage-dsconvert.log"
    cgroup_limit "$limit"
    echo "$storage: $(du -sh "$ds" | cut -f1) on disk ($fstype), zstd copy $(du -sh "$dsz" | cut -f1), memory limit $limit" \
        >>"$log/sizes.txt"

    # The disk's own rates, cold, in the same cgroup.
    evict "$ds"
    in_cgroup "$bin/dsbench" all "$ds" --cases io.seq.pread.cold,io.rand.chunk.pread.cold,decode.zstd --threads 1,4,16 \
        --size 2G --chunk-size 4M --zstd-level 1 --repetitions 2 --min-time 0 --drop-caches \
        --json "$log/$storage-disk.json" --force >"$log/$storage-dsbench.log" 2>&1
    disk_seq=$(jq '[.results[] | select(.case == "io.seq.pread.cold" and .status == "ok") | .metrics.rate.median] | max // 0' \
        "$log/$storage-disk.json" 2>/dev/null || echo 0)
    disk_rand=$(jq '[.results[] | select(.case == "io.rand.chunk.pread.cold" and .status == "ok") | .metrics.rate.median] | max // 0' \
        "$log/$storage-disk.json" 2>/dev/null || echo 0)
    disk_rand16=$(jq '[.results[] | select(.case == "io.rand.chunk.pread.cold" and .status == "ok" and .params.threads == 16) | .metrics.rate.median] | max // 0' \
        "$log/$storage-disk.json" 2>/dev/null || echo 0)
    echo "$storage disk (cgroup $limit): cold sequential $(awk -v r="$disk_seq" 'BEGIN { printf "%.2f GB/s", r / 1e9 }'),"\
        "random 4 MiB chunks $(awk -v r="$disk_rand" 'BEGIN { printf "%.2f GB/s", r / 1e9 }') (best of 1/4/16 threads)," \
        "$(awk -v r="$disk_rand16" 'BEGIN { printf "%.2f GB/s", r / 1e9 }') at 16 threads" \
        >>"$log/disk.txt"
    # f32 (disk-bound): dstrain's data path alone (dsbench loader cases, no
    # model), to tell a data-path shortfall from one of the training loop.
    if [ "$storage" = f32 ]; then
        for c in loader.stream.chunk loader.stream.direct.chunk; do
            evict "$ds"
            in_cgroup "$bin/dsbench" all "$ds" --cases "$c" --size 4G --chunk-size 4M --repetitions 1 --min-time 0 \
                --json "$log/$storage-$c.json" --force >>"$log/$storage-dsbench.log" 2>&1
            jq -r --arg d "$disk_rand16" '.results[] | select(.status == "ok") |
                "\(.case) (no model, 4 GiB): \(.metrics.rate.median / 1e9 * 100 | round / 100) GB/s, " +
                "\(.metrics.rate.median / ($d | tonumber) * 1000 | round / 10)% of the 16-thread random-chunk rate"' \
                "$log/$storage-$c.json" 2>/dev/null >>"$log/disk.txt"
        done
    fi

    ref_rate=0
    echo "== $storage rows ($((SECONDS - t0)) s)" >&2
    for row in $rows; do
        case $row in
        device) run_row "$storage" device host "$ds" --data device ;;
        chunk) run_row "$storage" chunk cgroup "$ds" --data stream ;;
        direct) run_row "$storage" direct cgroup "$ds" --data stream --direct ;;
        sequential) run_row "$storage" sequential cgroup "$ds" --data stream --order sequential ;;
        full) run_row "$storage" full cgroup "$ds" --data stream --order full --max-steps "$full_steps" ;;
        zstd) run_row "$storage" zstd cgroup "$dsz" --data stream ;;
        *) die "unknown row '$row' (device chunk direct sequential full zstd)" ;;
        esac
    done
    rm -rf "$ds" "$dsz"
done

echo "bench-larger-than-ram: $((SECONDS - t0)) s; logs in $log"
cat "$log/sizes.txt" "$log/disk.txt"
cat "$table"
echo "prediction check (dsplan --data stream vs the epoch; target within 15%):"
cat "$check"
if [ "${CHECK_PREDICTION:-0}" = 1 ] && [ "$bad_predictions" -gt 0 ]; then
    echo "bench-larger-than-ram: $bad_predictions predicted epoch(s) off by more than 15%" >&2
    exit 1
fi
