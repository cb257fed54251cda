#!/usr/bin/env bash
# dsconvert speed: dtype conversion per core, zstd chunk compression and
# decompression against `zstd -b` on the same bytes, and scaling with threads.
# usage: scripts/bench-convert.sh [BIN_DIR] [WORK_DIR] [SAMPLES]
# Prints one table; WORK_DIR (default /dev/shm when it exists) keeps I/O out of
# the CPU figures.
set -euo pipefail
BIN=${1:-build/bin}
WORK=${2:-$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )}/dstk-bench-convert.$$
N=${3:-40000}
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
cores=$(nproc)
json_rate() { # bytes_in / seconds from a --json report, in MB/s
    "$(command -v /usr/bin/python3 || command -v python3)" -c 'import json,sys; r=json.load(sys.stdin); print("%.0f" % (r["bytes_in"] / r["seconds"] / 1e6))'
}
"$BIN/dsgen" "$WORK/u8" --train "$N" --test 0 --shape 3x32x32 --dtype u8 -q
"$BIN/dsconvert" "$WORK/u8" "$WORK/f32" --dtype f32 --scale 0.00392156862745098 -q
printf '%-44s %10s\n' "case" "MB/s"
r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/bf16" --dtype bf16 -T 1 --json --force | json_rate)
printf '%-44s %10s\n' "f32 -> bf16, 1 thread (input bytes)" "$r"
r=$("$BIN/dsconvert" "$WORK/u8" "$WORK/f32b" --dtype f32 --scale 0.00392156862745098 -T 1 --json --force | json_rate)
printf '%-44s %10s\n' "u8 -> f32, 1 thread (input bytes)" "$r"
r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/bf16" --dtype bf16 -T "$cores" --json --force | json_rate)
printf '%-44s %10s\n' "f32 -> bf16, $cores threads (input bytes)" "$r"
tail -c $((N * 3072 * 4)) "$WORK/f32/train_x.npy" >"$WORK/f32.raw"
tail -c $((N * 3072)) "$WORK/u8/train_x.npy" >"$WORK/u8.raw"
for data in u8 f32; do
    for level in 1 3; do
        r=$("$BIN/dsconvert" "$WORK/$data" "$WORK/z" --compress "zstd:$level" -T 1 --json --force | json_rate)
        printf '%-44s %10s\n' "dsconvert $data zstd:$level compress, 1 thread" "$r"
        r=$("$BIN/dsconvert" "$WORK/z" "$WORK/back" -T 1 --json --force | json_rate)
        printf '%-44s %10s\n' "dsconvert $data zstd:$level decompress, 1 thread (in)" "$r"
        # zstd -b on 4 MiB blocks, as our chunks: "1#name : in -> out (ratio), C MB/s, D MB/s"
        command -v zstd >/dev/null || { printf '%-44s %s\n' "zstd -b$level" "(no zstd CLI here)"; continue; }
        zb=$(zstd -b"$level" -B4194304 -T1 -i3 "$WORK/$data.raw" 2>&1 | tr '\r' '\n' | grep -E 'MB/s.*MB/s' | tail -1 | sed 's/ *[0-9]*#$//' || true)
        printf '%-44s %s\n' "zstd -b$level -B4194304, 1 thread (C, D)" "$(echo "$zb" | sed 's/.*),//')"
        if [ "$cores" -gt 1 ]; then
            r=$("$BIN/dsconvert" "$WORK/$data" "$WORK/z" --compress "zstd:$level" -T "$cores" --json --force | json_rate)
            printf '%-44s %10s\n' "dsconvert $data zstd:$level compress, $cores threads" "$r"
        fi
    done
done
