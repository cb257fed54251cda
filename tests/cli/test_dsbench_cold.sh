#!/usr/bin/env bash
# Cold reads are really cold: a cold sequential pass over a file is slower
# than a warm one, and the file's pages were gone before each cold pass. Where
# the filesystem keeps its pages (tmpfs), dsbench waives the cold case and this
# test skips with dsbench's reason.
source "$(dirname "$0")/lib.sh"
DSB="$BIN/dsbench"
[ -x "$DSB" ] || skip "dsbench not built"
command -v jq >/dev/null || skip "jq is needed to read the JSON results"

# On the disk that holds the build tree unless DSTK_BENCH_DIR says otherwise
# ($TMPDIR is often tmpfs).
DIR=${DSTK_BENCH_DIR:-$BIN}
FILE=$(mktemp "$DIR/dsbench-cold.XXXXXX")
trap 'rm -f "$FILE"; rm -rf "$WORK"' EXIT
head -c $((128 << 20)) /dev/urandom >"$FILE"
sync "$FILE" 2>/dev/null || sync

expect_exit 0 "$DSB" all "$FILE" --cases io.seq.pread.cold,io.seq.pread.warm --repetitions 3 --min-time 0 \
    --json "$WORK/r.json" -q
cold_status=$(jq -r '.results[] | select(.case == "io.seq.pread.cold") | .status' "$WORK/r.json")
if [ "$cold_status" = waived ]; then
    skip "$(jq -r '.results[] | select(.case == "io.seq.pread.cold") | .reason' "$WORK/r.json")"
fi
cold=$(jq '.results[] | select(.case == "io.seq.pread.cold") | .metrics.rate.median' "$WORK/r.json")
warm=$(jq '.results[] | select(.case == "io.seq.pread.warm") | .metrics.rate.median' "$WORK/r.json")
resident=$(jq '.results[] | select(.case == "io.seq.pread.cold") | .params.resident_after_drop_pct' "$WORK/r.json")
echo "cold $cold B/s, warm $warm B/s, resident after drop $resident%"
expect_true "the cold pass ($cold B/s) is slower than the warm pass ($warm B/s)" \
    awk -v c="$cold" -v w="$warm" 'BEGIN { exit !(c < w) }'
expect_true "at most 5% of the file stayed cached after dropping ($resident%)" \
    awk -v r="$resident" 'BEGIN { exit !(r <= 5) }'
finish
