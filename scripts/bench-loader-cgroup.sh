#!/usr/bin/env bash
# The stream placement against the disk, in a memory cgroup: dsbench's
# loader.stream.chunk (dstrain's data path, no model) beside the disk's best
# cold random-chunk read rate (io.rand.chunk.pread.cold over --threads 1,4,16),
# both measured inside the same cgroup, every file's pages evicted before each
# pass. Issue 23's target: loader / disk >= 90% on 2 cores in 512 MiB.
#   scripts/bench-loader-cgroup.sh [BIN_DIR] [LOG_DIR]
# Needs root and a memory cgroup controller (v2 at /sys/fs/cgroup, or v1 at
# /sys/fs/cgroup/memory). Environment:
#   DATA_DIR  where the dataset is made (default build/loader-cgroup-data; removed at the end unless given)
#   SIZE      the dataset's train split in bytes of u8 3x32x32 samples (default 2G)
#   LIMIT     the cgroup's memory limit (default 512M)
#   RUNS      fresh processes per figure (default 3); the median is reported
#   CASE      the loader case (default loader.stream.chunk)
#   CPUS      the CPUs both benchmarks run on (taskset -c; e.g. 0,1 for the issue's 2 cores; default all)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=$(realpath "${1:-build/bin}")
log=${2:-build/logs/loader-cgroup}
mkdir -p "$log" && log=$(realpath "$log")
data=${DATA_DIR:-$PWD/build/loader-cgroup-data}
size=${SIZE:-2G}
limit=${LIMIT:-512M}
runs=${RUNS:-3}
case_key=${CASE:-loader.stream.chunk}

die() { echo "bench-loader-cgroup: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (memory cgroups and dropping the page cache)"
for t in dsgen dsbench; do [ -x "$bin/$t" ] || die "no $bin/$t (build the tools first)"; done
command -v jq >/dev/null || die "needs jq"
bytes=$(numfmt --from=iec "$size") || die "bad SIZE '$size'"
limit_bytes=$(numfmt --from=iec "$limit") || die "bad LIMIT '$limit'"

source "$(dirname "$0")/lib/cgroup.sh"
cgroup_create dstk-loader
cgroup_limit "$limit_bytes"
cleanup() {
    cgroup_remove
    [ -z "${DATA_DIR:-}" ] && rm -rf "$data"
}
trap cleanup EXIT
CGROUP_PIN=()
[ -n "${CPUS:-}" ] && CGROUP_PIN=(taskset -c "$CPUS")

ds=$data/u8
if [ ! -f "$ds/dataset.json" ]; then
    mkdir -p "$data"
    "$bin/dsgen" "$ds" --train $((bytes / 3072)) --test 0 --shape 3x32x32 --dtype u8 -q ||
        die "dsgen failed"
fi
echo "dataset $ds ($(du -sh "$ds" | cut -f1)), cgroup $cg limit $limit, CPUs ${CPUS:-all} of $(nproc --all), $runs runs, load $(cut -d' ' -f1-3 /proc/loadavg)"

# rate FILE KEY: the best rate of KEY in a dsbench JSON file (B/s).
rate() { jq -r --arg k "$2" '[.results[] | select(.case == $k) | .metrics.rate.median] | max // empty' "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
gbs() { awk -v r="$1" 'BEGIN { printf "%.3f GB/s", r / 1e9 }'; }

disk_rates=() loader_rates=()
for k in $(seq "$runs"); do
    evict "$ds"
    in_cgroup "$bin/dsbench" all "$ds" --cases io.rand.chunk.pread.cold --threads 1,4,16 --size "$size" \
        --chunk-size 4M --repetitions 1 --min-time 0 --json "$log/disk-$k.json" -f -q >>"$log/runs.log" 2>&1 ||
        die "dsbench (disk) failed: $log/runs.log"
    evict "$ds"
    in_cgroup "$bin/dsbench" all "$ds" --cases "$case_key" --size "$size" --chunk-size 4M --repetitions 1 \
        --min-time 0 --json "$log/loader-$k.json" -f -q >>"$log/runs.log" 2>&1 ||
        die "dsbench ($case_key) failed: $log/runs.log"
    d=$(rate "$log/disk-$k.json" io.rand.chunk.pread.cold) l=$(rate "$log/loader-$k.json" "$case_key")
    [ -n "$d" ] && [ -n "$l" ] || die "no rate in run $k's results ($log)"
    disk_rates+=("$d") loader_rates+=("$l")
    echo "run $k: disk random chunks $(gbs "$d"), $case_key $(gbs "$l") ($(awk -v a="$l" -v b="$d" 'BEGIN { printf "%.0f%%", 100 * a / b }'))"
done
dm=$(printf '%s\n' "${disk_rates[@]}" | median) lm=$(printf '%s\n' "${loader_rates[@]}" | median)
echo "median: disk $(gbs "$dm"), $case_key $(gbs "$lm"): $(awk -v a="$lm" -v b="$dm" 'BEGIN { printf "%.1f%%", 100 * a / b }') of the disk"
