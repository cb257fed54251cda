#!/usr/bin/env bash
# Sequential-read figures of dsbench and fio on the same file and settings:
# one thread, buffered pread (fio: psync) and O_DIRECT, --block-size blocks over
# the first --size bytes, cold page cache (the file's pages dropped before
# each pass). Prints both medians and the ratio dsbench/fio for each mode.
#
#   scripts/fio-compare.sh FILE [BLOCK_SIZE [SIZE [REPETITIONS]]]
#   DSTK_BIN=build/bin scripts/fio-compare.sh /data/big/train_x.npy 1M 1G 5
set -euo pipefail
FILE=${1:?usage: fio-compare.sh FILE [BLOCK_SIZE [SIZE [REPETITIONS]]]}
BS=${2:-1M}
SIZE=${3:-1G}
REPS=${4:-5}
BIN=${DSTK_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
command -v fio >/dev/null || { echo "fio-compare: fio is not installed (apt-get install fio)" >&2; exit 3; }
command -v jq >/dev/null || { echo "fio-compare: jq is not installed (apt-get install jq)" >&2; exit 3; }
[ -x "$BIN/dsbench" ] || { echo "fio-compare: $BIN/dsbench not found (set DSTK_BIN)" >&2; exit 3; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# REPS rounds; in each, one dsbench figure and one fio figure per mode, taken
# back to back so that drift in the machine's load hits both alike. dsbench:
# one cold pass after its warm-up (posix_fadvise DONTNEED before each);
# fio: invalidate=1 drops the file's pages before the job. Medians of the rounds.
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

printf '%-10s %14s %14s %8s\n' mode "dsbench MB/s" "fio MB/s" ratio
for mode in buffered direct; do
    if [ $mode = buffered ]; then key=io.seq.pread.cold direct=0; else key=io.seq.direct direct=1; fi
    : >"$TMP/ds" && : >"$TMP/fio"
    for i in $(seq "$REPS"); do
        "$BIN/dsbench" all "$FILE" --cases $key --block-size "$BS" --size "$SIZE" --repetitions 1 --min-time 0 \
            --json "$TMP/r.json" --force -q >/dev/null || true
        status=$(jq -r --arg k $key '.results[] | select(.case == $k) | .status' "$TMP/r.json")
        if [ "$status" != ok ]; then
            printf '%-10s %s\n' $mode "dsbench $status: $(jq -r --arg k $key '.results[] | select(.case == $k) | .reason' "$TMP/r.json")"
            continue 2
        fi
        jq --arg k $key '.results[] | select(.case == $k) | .metrics.rate.median' "$TMP/r.json" >>"$TMP/ds"
        fio --name=seq --filename="$FILE" --rw=read --bs="$BS" --size="$SIZE" --ioengine=psync --direct=$direct \
            --invalidate=1 --numjobs=1 --thread --output-format=json 2>/dev/null | jq '.jobs[0].read.bw_bytes' >>"$TMP/fio"
    done
    ds=$(median <"$TMP/ds")
    fio=$(median <"$TMP/fio")
    awk -v m=$mode -v d="$ds" -v f="$fio" 'BEGIN { printf "%-10s %14.1f %14.1f %8.2f\n", m, d / 1e6, f / 1e6, d / f }'
done
