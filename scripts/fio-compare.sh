#!/usr/bin/env bash
# Sequential-read figures of dsbench and fio on the same file and settings:
# one thread, buffered pread (fio: psync) and O_DIRECT, --block-size blocks over
# the first --size bytes, cold page cache (the file's pages dropped before
# each pass). Prints both figures and the ratio dsbench/fio for each mode.
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

# dsbench: median of REPS cold passes, each after posix_fadvise(DONTNEED).
"$BIN/dsbench" all "$FILE" --cases io.seq.pread.cold,io.seq.direct --block-size "$BS" --size "$SIZE" \
    --repetitions "$REPS" --min-time 0 --json "$TMP/dsbench.json" -q >/dev/null

# fio: REPS runs of one job each, invalidate=1 drops the file's pages before
# the job (posix_fadvise DONTNEED, as dsbench); median of the runs.
fio_median() { # direct(0/1)
    local direct=$1 i
    for i in $(seq "$REPS"); do
        fio --name=seq --filename="$FILE" --rw=read --bs="$BS" --size="$SIZE" --ioengine=psync \
            --direct="$direct" --invalidate=1 --numjobs=1 --thread --output-format=json 2>/dev/null |
            jq '.jobs[0].read.bw_bytes'
    done | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

printf '%-10s %14s %14s %8s\n' mode "dsbench MB/s" "fio MB/s" ratio
for mode in buffered direct; do
    if [ $mode = buffered ]; then key=io.seq.pread.cold direct=0; else key=io.seq.direct direct=1; fi
    status=$(jq -r --arg k $key '.results[] | select(.case == $k) | .status' "$TMP/dsbench.json")
    if [ "$status" != ok ]; then
        printf '%-10s %s\n' $mode "dsbench $status: $(jq -r --arg k $key '.results[] | select(.case == $k) | .reason' "$TMP/dsbench.json")"
        continue
    fi
    ds=$(jq --arg k $key '.results[] | select(.case == $k) | .metrics.rate.median' "$TMP/dsbench.json")
    fio=$(fio_median $direct)
    awk -v m=$mode -v d="$ds" -v f="$fio" 'BEGIN { printf "%-10s %14.1f %14.1f %8.2f\n", m, d / 1e6, f / 1e6, d / f }'
done
