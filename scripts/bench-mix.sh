#!/usr/bin/env bash
# A mix of datasets against one member on the GPU (issue 25's benchmark), in a
# memory cgroup: four members of u8 3x32x32 of different sizes totalling 4x
# the cgroup's limit, the two smallest kept in host memory (the page cache)
# within the host budget, the two largest streamed from disk (O_DIRECT). It
# prints
#   - dstrain's samples/s on the mix (each epoch after the first, whose
#     host-kept members are read from disk) against the device placement of
#     one member of the same shape, the same model and batch (the speed
#     reference): the issue's target is >= 95%;
#   - the process's peak RSS against the host ceiling dstrain printed, and
#     the mix plan's host ceiling (its sources + the host-kept members' bytes)
#     against the cgroup's limit;
#   - each member's share of the samples over an epoch against its weight's
#     (the target: within 1%);
#   - with WAYS=python (or "dstrain python"): the same mix through dstk.Loader
#     into a compiled PyTorch loop against that loop on the first member in
#     GPU memory, in RUNS fresh processes (scripts/bench-mix-python.py; the
#     dstk package and PyTorch installed): the target is >= 95%.
#   scripts/bench-mix.sh [BIN_DIR] [LOG_DIR]
# Needs root, a memory cgroup controller (v2 at /sys/fs/cgroup, or v1 at
# /sys/fs/cgroup/memory) and a GPU. About 3 minutes on an H100 with the
# defaults. Environment:
#   DATA_DIR  where the members are made (default build/mix-data; removed at the end unless given)
#   LIMIT     the cgroup's memory limit (default 4G); the members total 4 x LIMIT
#   HOST_MEM  dstrain --host-mem, the mix's host budget (default 3/4 of LIMIT)
#   EPOCHS    epochs of each run (default 3)
#   MODEL     dstrain --model (default ref-cnn); BATCH (default 256)
#   WAYS      dstrain, python, or both (default dstrain)
#   PY_LIMIT  the cgroup's limit during the python runs (default LIMIT + 2G:
#             PyTorch and its CUDA context take about that much of their own)
#   RUNS      python processes (default 3)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=$(realpath "${1:-build/bin}")
log=${2:-build/logs/mix}
mkdir -p "$log" && log=$(realpath "$log")
data=${DATA_DIR:-$PWD/build/mix-data}
limit=${LIMIT:-4G}
epochs=${EPOCHS:-3}
model=${MODEL:-ref-cnn}
batch=${BATCH:-256}
ways=${WAYS:-dstrain}
runs=${RUNS:-3}

die() { echo "bench-mix: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (memory cgroups and dropping the page cache)"
for t in dsgen dstrain; do [ -x "$bin/$t" ] || die "no $bin/$t (build the tools first)"; done
command -v jq >/dev/null || die "needs jq"
limit_bytes=$(numfmt --from=iec "$limit") || die "bad LIMIT '$limit'"
host_mem=${HOST_MEM:-$((limit_bytes / 4 * 3))}
host_mem_bytes=$(numfmt --from=iec "$host_mem") || die "bad HOST_MEM '$host_mem'"

py_limit_bytes=$(numfmt --from=iec "${PY_LIMIT:-$((limit_bytes + (2 << 30)))}") || die "bad PY_LIMIT"

source "$(dirname "$0")/lib/cgroup.sh"
cgroup_create dstk-mix
cgroup_limit "$limit_bytes"
cleanup() {
    cgroup_remove
    [ -z "${DATA_DIR:-}" ] && rm -rf "$data"
}
trap cleanup EXIT

# Members: 1/4, 3/8, 11/8 and 2 of LIMIT (4 x LIMIT in all); weights 4,3,2,1,
# so member 0 has the largest weight-to-size ratio and an epoch is 2.5 times
# its samples (10/4), of which the streamed members 2 and 3 take 30%.
sample=3072
parts=(2 3 11 16) # eighths of LIMIT
weights=(4 3 2 1)
members=()
for i in 0 1 2 3; do
    m=$data/m$i
    n=$((limit_bytes / 8 * ${parts[$i]} / sample))
    if [ ! -f "$m/dataset.json" ]; then
        mkdir -p "$data"
        "$bin/dsgen" "$m" --train "$n" --test 0 --shape 3x32x32 --dtype u8 --classes 10 --seed $((i + 1)) -q ||
            die "dsgen $m failed"
    fi
    members+=("$m")
done
echo "members: $(for m in "${members[@]}"; do printf '%s (%s) ' "$(basename "$m")" "$(du -sh "$m" | cut -f1)"; done)"
echo "cgroup $cg limit $limit, --host-mem $(numfmt --to=iec "$host_mem_bytes"), model $model, batch $batch, $epochs epochs, ways: $ways"

run_dstrain() {
    local common=(--model "$model" --batch "$batch" --epochs "$epochs" --seed 1 --force)
    evict "${members[@]}"
    in_cgroup "$bin/dstrain" "${members[@]}" --weights "$(IFS=,; echo "${weights[*]}")" \
        --placement host,host,stream,stream --host-mem "$host_mem_bytes" "${common[@]}" --log-json "$log/mix.jsonl" \
        --save "$log/mix.safetensors" >"$log/mix.out" 2>"$log/mix.err" || die "dstrain on the mix failed: $log/mix.err"
    evict "${members[@]}"
    in_cgroup "$bin/dstrain" "${members[0]}" --data device "${common[@]}" --log-json "$log/device.jsonl" \
        --save "$log/device.safetensors" >"$log/device.out" 2>"$log/device.err" ||
        die "dstrain on one member (device) failed: $log/device.err"

    grep '^dstrain: mix' "$log/mix.err" | grep -v 'samples this epoch'
    # Epochs after the first (the first reads the host-kept members from disk).
    rate() { jq -s '[.[] | select(.event == "epoch" and .epoch > 1) | .samples_per_second] | add / length' "$1"; }
    local mix_rate dev_rate
    mix_rate=$(rate "$log/mix.jsonl") dev_rate=$(rate "$log/device.jsonl")
    [ "$mix_rate" != null ] && [ "$dev_rate" != null ] || die "no epoch after the first in $log (EPOCHS >= 2)"
    printf 'samples/s (epochs 2..%s): mix %.0f, one member on the device %.0f: %.1f%% (target >= 95%%)\n' "$epochs" \
        "$mix_rate" "$dev_rate" "$(jq -n "100 * $mix_rate / $dev_rate")"
    jq -rs --arg limit "$limit_bytes" '[.[] | select(.event == "epoch")] | last |
        "peak RSS \(.host_peak_rss / 1048576 | floor) MiB, printed host ceiling \(.host_ceiling / 1048576 | floor) MiB: " +
        (if .host_peak_rss <= .host_ceiling then "within" else "OVER by \((.host_peak_rss - .host_ceiling) / 1048576 | floor) MiB" end) +
        "; the mix plan'"'"'s host ceiling \(.mix_host_ceiling / 1048576 | floor) MiB (page cache of the host-kept members included), cgroup limit \($limit | tonumber / 1048576 | floor) MiB"' \
        "$log/mix.jsonl"
    for run in mix device; do
        jq -rs --arg run "$run" '([.[] | select(.event == "memory")] | first) as $m |
            [.[] | select(.event == "epoch")] | "\($run): peak RSS by epoch " +
            ([.[] | "\(.host_peak_rss / 1048576 | floor)"] | join(", ")) + " MiB; ceiling \($m.host_ceiling / 1048576 | floor) MiB = process \($m.host_process / 1048576 | floor) + data path \($m.host_planned_data / 1048576 | floor)"' \
            "$log/$run.jsonl"
    done
    jq -rs '.[] | select(.event == "epoch" and .first_batch == 0) |
        (.mix_samples | add) as $n |
        "epoch \(.epoch): " + ([range(0; .mix_samples | length) as $i |
          "m\($i) \(100 * .mix_samples[$i] / $n * 100 | round / 100)% (weight \(100 * .mix_planned_shares[$i] * 100 | round / 100)%)"] |
          join(", ")) +
        "; largest gap \([range(0; .mix_samples | length) as $i | (100 * .mix_samples[$i] / $n - 100 * .mix_planned_shares[$i]) | fabs] | max * 1000 | round / 1000) points (target < 1)"' \
        "$log/mix.jsonl"
}

# The same mix through dstk.Loader into a compiled PyTorch loop, each process
# in the cgroup raised by PyTorch's own share (PY_LIMIT); the page cache of
# the host-kept members stays charged to it from one process to the next.
run_python() {
    cgroup_limit "$py_limit_bytes"
    local r files=()
    evict "${members[@]}"
    for r in $(seq 1 "$runs"); do
        in_cgroup python3 scripts/bench-mix-python.py --members "$(IFS=,; echo "${members[*]}")" \
            --weights "$(IFS=,; echo "${weights[*]}")" --placement host,host,stream,stream \
            --host-mem "$host_mem_bytes" --epochs "$epochs" --batch 256 >"$log/py$r.json" 2>"$log/py$r.err" ||
            die "the python mix (process $r) failed: $log/py$r.err"
        files+=("$log/py$r.json")
    done
    cgroup_limit "$limit_bytes"
    echo "python: cgroup limit $(numfmt --to=iec "$py_limit_bytes"), ref-cnn's PyTorch twin, batch 256, $epochs epochs"
    python3 scripts/bench-mix-python.py --summarise "${files[@]}"
}

[[ " $ways " == *" dstrain "* ]] && run_dstrain
[[ " $ways " == *" python "* ]] && run_python
exit 0
