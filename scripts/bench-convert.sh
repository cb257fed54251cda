#!/usr/bin/env bash
# dsconvert speed, one short table (well under 2 minutes on 16 cores):
#  - the f32->bf16 and u8->f32 kernels alone, in memory, per core and on all
#    cores (dsconvert --benchmark; target >= 1 GB/s per core);
#  - zstd-chunked compression / decompression of the same raw bytes through
#    dsconvert's writer and reader, against `zstd -b` (4 MiB blocks, 1 thread)
#    when the zstd CLI is installed (target: within 10% per core);
#  - whole conversions (read -> convert/compress -> write) at 1 and all threads.
# usage: scripts/bench-convert.sh [BIN_DIR] [WORK_DIR] [SAMPLES]
# WORK_DIR (default /dev/shm when it exists) keeps disk I/O out of the CPU figures.
set -euo pipefail
BIN=${1:-build/bin}
WORK=${2:-$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )}/dstk-bench-convert.$$
N=${3:-20000}
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
cores=$(nproc)
PY=$(command -v /usr/bin/python3 || command -v python3)
row() { printf '%-46s %8s %10s %10s\n' "$@"; }
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN/dsgen" "$WORK/u8" --train "$N" --test 0 --shape 3x32x32 --dtype u8 -q
"$BIN/dsconvert" "$WORK/u8" "$WORK/f32" --dtype f32 --scale 0.00392156862745098 -q
tail -c $((N * 3072 * 4)) "$WORK/f32/train_x.npy" >"$WORK/f32.raw"

row "case" "threads" "in MB/s" "out MB/s"
# Kernels and zstd through dsconvert's own code, in memory.
"$BIN/dsconvert" --benchmark "$WORK/f32.raw" -T "$cores" --json >"$WORK/bench.json"
"$PY" - "$WORK/bench.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    name = r["case"] if r["case"].startswith("kernel") else "dsconvert " + r["case"] + " (f32.raw)"
    print("%-46s %8d %10.0f %10.0f" % (name, r["threads"], r["in_mb_per_s"], r["out_mb_per_s"]))
PY
# zstd's own benchmark on the same bytes (in = uncompressed for C, D both quoted on uncompressed bytes).
if command -v zstd >/dev/null; then
    for level in 1 3; do
        line=$(zstd -b"$level" -B4194304 -T1 -i2 "$WORK/f32.raw" 2>&1 | tr '\r' '\n' | grep -a -E 'MB/s.*MB/s' | tail -1)
        c=$(echo "$line" | sed -E 's/.*\), *([0-9.]+) MB\/s, *([0-9.]+) MB\/s.*/\1/')
        d=$(echo "$line" | sed -E 's/.*\), *([0-9.]+) MB\/s, *([0-9.]+) MB\/s.*/\2/')
        row "zstd -b$level -B4194304 compress (f32.raw)" 1 "$c" ""
        row "zstd -b$level -B4194304 decompress (f32.raw)" 1 "" "$d"
    done
else
    echo "(no zstd CLI on this host: zstd -b figures not measured; compare the dsconvert rows with zstd -b elsewhere)"
fi
# Whole conversions, dataset to dataset (bytes_in / wall seconds).
json_rate() { "$PY" -c 'import json,sys; r=json.load(sys.stdin); print("%.0f" % (r["bytes_in"] / r["seconds"] / 1e6))'; }
for t in 1 "$cores"; do
    r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/o" --dtype bf16 -T "$t" --json --force | json_rate)
    row "whole conversion f32 -> bf16 (npy)" "$t" "$r" ""
    r=$("$BIN/dsconvert" "$WORK/u8" "$WORK/o" --dtype f32 --scale 0.00392156862745098 -T "$t" --json --force | json_rate)
    row "whole conversion u8 -> f32 (npy)" "$t" "$r" ""
    r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/o" --compress zstd:1 -T "$t" --json --force | json_rate)
    row "whole conversion f32 -> zstd:1" "$t" "$r" ""
    r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/o" --compress zstd:3 -T "$t" --json --force | json_rate)
    row "whole conversion f32 -> zstd:3" "$t" "$r" ""
done
echo "(in MB/s: input bytes; out MB/s: output bytes; zstd rows: uncompressed bytes in for compress, out for decompress)"
