#!/usr/bin/env bash
# dsconvert speed, one short table per section:
#  kernels  the f32->bf16 and u8->f32 kernels alone, in memory, per core and
#           on all cores (dsconvert --benchmark; target >= 1 GB/s per core);
#  zstd     zstd-chunked compression / decompression of the same raw bytes
#           through dsconvert's writer and reader, against `zstd -b` (4 MiB
#           blocks, 1 thread), alternated REPEAT times, best of each (target:
#           within 10% per core);
#  whole    whole conversions (read -> convert/compress -> write) at 1 and all
#           threads, in WORK_DIR;
#  disk     the sequential read and write bandwidth of DISK_DIR's filesystem
#           (O_DIRECT reads, fdatasync'd writes; fio when installed, else dd)
#           against a conversion that does no CPU work (npy -> npy, same
#           dtype, input evicted from the page cache, output fsynced) and
#           against cp + sync of the same file (target: >= 70% of the disk).
# usage: scripts/bench-convert.sh [BIN_DIR] [WORK_DIR] [SAMPLES]
# env:   SECTIONS="kernels zstd whole disk" REPEAT=3
#        DISK_DIR=/var/tmp DISK_SAMPLES=700K (3 KiB samples: 700K = 2.15 GB)
# WORK_DIR (default /dev/shm when it exists) keeps disk I/O out of the CPU figures.
set -euo pipefail
BIN=${1:-build/bin}
WORK=${2:-$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )}/dstk-bench-convert.$$
N=${3:-20000}
SECTIONS=${SECTIONS:-kernels zstd whole disk}
REPEAT=${REPEAT:-3}
DISK=${DISK_DIR:-/var/tmp}/dstk-bench-disk.$$
DISK_N=${DISK_SAMPLES:-700K}
mkdir -p "$WORK"
trap 'rm -rf "$WORK" "$DISK"' EXIT
cores=$(nproc)
PY=$(command -v /usr/bin/python3 || command -v python3)
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
row() { printf '%-50s %8s %10s %10s %12s\n' "$@"; }
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN/dsgen" "$WORK/u8" --train "$N" --test 0 --shape 3x32x32 --dtype u8 -q
"$BIN/dsconvert" "$WORK/u8" "$WORK/f32" --dtype f32 --scale 0.00392156862745098 -q
tail -c $((N * 3072 * 4)) "$WORK/f32/train_x.npy" >"$WORK/f32.raw"

row "case" "threads" "in MB/s" "out MB/s" "in MB/cpu-s"
# Kernels and zstd through dsconvert's own code, in memory; the best of REPEAT
# runs of each row (the machine may be shared).
if has kernels || has zstd; then
    file=""
    has zstd && file="$WORK/f32.raw"
    for ((r = 0; r < REPEAT; r++)); do
        # shellcheck disable=SC2086
        "$BIN/dsconvert" --benchmark $file -T "$cores" --json >"$WORK/bench.$r.json"
        if has zstd && command -v zstd >/dev/null; then
            for level in 1 3; do
                zstd -b"$level" -B4194304 -T1 -i2 "$WORK/f32.raw" 2>&1 | tr '\r' '\n' |
                    grep -a -E 'MB/s.*MB/s' | tail -1 >"$WORK/zstd.$level.$r"
            done
        fi
    done
    "$PY" - "$WORK" "$REPEAT" <<'PY'
import json, sys, glob
work, repeat = sys.argv[1], int(sys.argv[2])
best = {}
for r in range(repeat):
    for row in json.load(open("%s/bench.%d.json" % (work, r)))["results"]:
        key = (row["case"], row["threads"])
        b = best.setdefault(key, dict(row))
        for k in ("in_mb_per_s", "out_mb_per_s", "in_mb_per_cpu_s", "out_mb_per_cpu_s"):
            b[k] = max(b[k], row[k])
for (case, threads), r in best.items():
    name = case if case.startswith("kernel") else "dsconvert " + case + " (f32.raw)"
    print("%-50s %8d %10.0f %10.0f %12.0f" % (name, threads, r["in_mb_per_s"], r["out_mb_per_s"], r["in_mb_per_cpu_s"]))
PY
    # zstd's own benchmark on the same bytes (its C and D speeds are both on uncompressed bytes).
    if has zstd; then
        if command -v zstd >/dev/null; then
            for level in 1 3; do
                c=0 d=0
                for ((r = 0; r < REPEAT; r++)); do
                    line=$(cat "$WORK/zstd.$level.$r")
                    c=$(echo "$line" "$c" | sed -E 's/.*\), *([0-9.]+) MB\/s, *([0-9.]+) MB\/s.* ([0-9.]+)$/\1 \3/' | awk '{print ($1>$2)?$1:$2}')
                    d=$(echo "$line" "$d" | sed -E 's/.*\), *([0-9.]+) MB\/s, *([0-9.]+) MB\/s.* ([0-9.]+)$/\2 \3/' | awk '{print ($1>$2)?$1:$2}')
                done
                row "zstd -b$level -B4194304 compress (f32.raw)" 1 "$c" "" ""
                row "zstd -b$level -B4194304 decompress (f32.raw)" 1 "" "$d" ""
            done
        else
            echo "(no zstd CLI on this host: zstd -b figures not measured; compare the dsconvert rows with zstd -b elsewhere)"
        fi
    fi
fi
# Whole conversions, dataset to dataset (bytes_in / wall seconds).
json_rate() { "$PY" -c 'import json,sys; r=json.load(sys.stdin); print("%.0f" % (r["bytes_in"] / r["seconds"] / 1e6))'; }
if has whole; then
    for t in 1 "$cores"; do
        r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/o" --dtype bf16 -T "$t" --json --force | json_rate)
        row "whole conversion f32 -> bf16 (npy)" "$t" "$r" "" ""
        r=$("$BIN/dsconvert" "$WORK/u8" "$WORK/o" --dtype f32 --scale 0.00392156862745098 -T "$t" --json --force | json_rate)
        row "whole conversion u8 -> f32 (npy)" "$t" "$r" "" ""
        r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/o" --compress zstd:1 -T "$t" --json --force | json_rate)
        row "whole conversion f32 -> zstd:1" "$t" "$r" "" ""
        r=$("$BIN/dsconvert" "$WORK/f32" "$WORK/o" --compress zstd:3 -T "$t" --json --force | json_rate)
        row "whole conversion f32 -> zstd:3" "$t" "$r" "" ""
    done
fi
echo "(in MB/s: input bytes per wall second; in MB/cpu-s: per CPU second of the process;"
echo " zstd rows: uncompressed bytes in for compress, out for decompress)"

# ---- disk: sequential bandwidth vs a conversion with no CPU work -------------
if has disk; then
    mkdir -p "$DISK"
    "$BIN/dsgen" "$DISK/in" --train "$DISK_N" --test 0 --shape 3x32x32 --dtype u8 -q
    src="$DISK/in/train_x.npy"
    bytes=$(stat -c %s "$src")
    mb=$((bytes / 1000000))
    # Evicts FILE from the page cache (posix_fadvise DONTNEED, no privileges, touches nothing else).
    evict() { sync "$1" 2>/dev/null || sync; dd if="$1" iflag=nocache count=0 status=none; }
    rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
    secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'; }
    echo
    echo "disk: $DISK ($(df -hT "$DISK" | awk 'NR==2 {print $2 ", " $1}')), ${mb} MB dataset field, best of $REPEAT"
    rd=0 wr=0 conv=0 cp=0
    for ((r = 0; r < REPEAT; r++)); do
        if command -v fio >/dev/null; then
            w=$(fio --name=w --filename="$DISK/fio" --rw=write --bs=1M --size="$bytes" --direct=1 --end_fsync=1 \
                --ioengine=psync --output-format=json 2>/dev/null | "$PY" -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"] / 1e6))')
            rr=$(fio --name=r --filename="$DISK/fio" --rw=read --bs=1M --size="$bytes" --direct=1 \
                --ioengine=psync --output-format=json 2>/dev/null | "$PY" -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 1e6))')
            tool="fio, 1 MiB O_DIRECT"
        else
            w=$(rate "$bytes" "$(secs dd if=/dev/zero of="$DISK/fio" bs=4M count=$((bytes / 4194304)) conv=fdatasync)")
            rr=$(rate "$bytes" "$(secs dd if="$DISK/fio" of=/dev/null bs=4M iflag=direct)")
            tool="dd, 4 MiB, conv=fdatasync / iflag=direct"
        fi
        rm -f "$DISK/fio"
        evict "$src"
        c=$(rate "$bytes" "$(secs "$BIN/dsconvert" "$DISK/in" "$DISK/out" --force -q)")
        rm -rf "$DISK/out"
        evict "$src"
        k=$(rate "$bytes" "$(secs sh -c "cp '$src' '$DISK/copy' && sync '$DISK/copy'")")
        rm -f "$DISK/copy"
        rd=$((rr > rd ? rr : rd)) wr=$((w > wr ? w : wr)) conv=$((c > conv ? c : conv)) cp=$((k > cp ? k : cp))
    done
    # Reading and writing one disk at once: a copy can at best take size/read + size/write.
    bound=$(awk -v r="$rd" -v w="$wr" 'BEGIN { printf "%.0f", 1 / (1 / r + 1 / w) }')
    row "disk sequential read ($tool)" "" "$rd" "" ""
    row "disk sequential write ($tool)" "" "" "$wr" ""
    row "copy bound 1/(1/read + 1/write)" "" "$bound" "" ""
    row "cp + sync of the same file (cold)" "" "$cp" "" ""
    row "dsconvert npy -> npy, same dtype (cold, fsynced)" "$cores" "$conv" "" ""
    awk -v c="$conv" -v b="$bound" -v k="$cp" -v w="$wr" -v r="$rd" 'BEGIN {
        printf "ratio: dsconvert / copy bound %.2f, / cp %.2f, / min(read, write) %.2f (target >= 0.70)\n",
               c / b, c / k, c / (r < w ? r : w) }'
fi
