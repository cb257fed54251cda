#!/usr/bin/env bash
# dsbench on the real binary: help, list, a tiny run with JSON, exit codes, compare.
source "$(dirname "$0")/lib.sh"
DSB="$BIN/dsbench"
[ -x "$DSB" ] || skip "dsbench not built"
command -v jq >/dev/null || skip "jq is needed to read the JSON results"

FILE="$WORK/data.bin"
head -c $((8 << 20)) /dev/urandom >"$FILE"
FAST=(--repetitions 2 --min-time 0 --threads 1,2 --size 4M --transfer-sizes 64K)

expect_exit 0 "$DSB" --help
expect_stdout 'compare'
expect_exit 0 "$DSB" --list
expect_stdout '^io\.seq\.pread\.cold '
expect_stdout '^h2d\.pinned '
expect_stdout '^decode\.zstd '

# A run: table on stdout, JSON file with the schema's fields.
expect_exit 0 "$DSB" all "$FILE" --cases 'io.seq.pread.warm,io.rand.sample.pread.warm,decode.convert.cpu.u8' \
    "${FAST[@]}" --json "$WORK/a.json"
expect_stdout '^io\.seq\.pread\.warm +[0-9.]+ [kMG]?B/s'
expect_stdout '^io\.rand\.sample\.pread\.warm +threads=2 '
expect_stderr 'results written to'
expect_file "$WORK/a.json"
expect_true "schema_version is 1" test "$(jq .schema_version "$WORK/a.json")" = 1
expect_true "context names the file" test "$(jq -r .context.file "$WORK/a.json")" = "$FILE"
expect_true "context has the filesystem" test -n "$(jq -r .context.filesystem "$WORK/a.json")"
expect_true "5 results (1 + 2 threads + 2 threads)" test "$(jq '.results | length' "$WORK/a.json")" = 5
expect_true "rates are positive with a unit" \
    test "$(jq '[.results[] | select(.metrics.rate.median > 0 and .metrics.rate.unit == "B/s")] | length' "$WORK/a.json")" = 5
expect_true "random reads have p99 latency" \
    test "$(jq '[.results[] | select(.metrics.latency_p99.unit == "us")] | length' "$WORK/a.json")" = 2

# O_DIRECT chunk reads (what the streams read): measured at whole aligned
# blocks where the filesystem takes O_DIRECT, waived with the reason on tmpfs.
"$DSB" all "$FILE" --cases io.rand.chunk.direct "${FAST[@]}" --chunk-size 1M --json "$WORK/d.json" -q \
    >"$OUT" 2>"$ERR"
rc=$?
case $rc in
0) expect_true "O_DIRECT chunk reads: 2 results, 1 MiB reads, positive rates" jq -e '[.results[]
       | select(.status == "ok" and .params.read_bytes == 1048576 and .metrics.rate.median > 0)] | length == 2' \
       "$WORK/d.json" ;;
3) expect_true "O_DIRECT chunk reads waived with the reason" jq -e '.results[0].status == "waived" and
       (.results[0].reason | test("O_DIRECT"))' "$WORK/d.json" ;;
*) fail "dsbench io.rand.chunk.direct exited $rc" ;;
esac

# No overwrite without --force; --force overwrites.
expect_exit 2 "$DSB" all "$FILE" --cases io.seq.pread.warm "${FAST[@]}" --json "$WORK/a.json"
expect_stderr 'force'
expect_exit 0 "$DSB" all "$FILE" --cases io.seq.pread.warm "${FAST[@]}" --json "$WORK/b.json" --force -q
expect_exit 0 "$DSB" all "$FILE" --cases io.seq.pread.warm "${FAST[@]}" --json - -q
expect_true "--json - prints one JSON document" jq -e '.results[0].case == "io.seq.pread.warm"' "$OUT"

# Usage errors.
expect_exit 2 "$DSB" all "$FILE" --cases nothing.like.this
expect_stderr 'matches no case'
expect_exit 2 "$DSB" all "$WORK/missing.bin" --cases io.seq
expect_exit 2 "$DSB" all "$FILE" --threads 0
expect_exit 2 "$DSB" all "$FILE" --block-size 12Q
expect_exit 2 "$DSB"
expect_stderr 'no command'

# No file: the cases that need one are waived, the others run; all waived -> 3.
expect_exit 0 "$DSB" all --cases io.seq.pread.warm,decode.convert.cpu.u8 "${FAST[@]}"
expect_stdout 'io\.seq\.pread\.warm +waived: needs a dataset'
expect_exit 3 "$DSB" all --cases io.seq.pread.warm "${FAST[@]}"
expect_stderr 'nothing could be measured'

# GPU cases: measured with a GPU, waived (exit 3) without.
"$DSB" all --cases h2d.pinned "${FAST[@]}" >"$OUT" 2>"$ERR"
rc=$?
if [ $rc -eq 3 ]; then
    expect_stdout 'h2d\.pinned +waived: (built without CUDA|no usable GPU|no NVIDIA (driver or )?GPU|the NVIDIA driver supports)'
else
    expect_true "h2d.pinned runs with a GPU (exit $rc)" test $rc -eq 0
fi

# compare: side by side with ratios; a corrupt file is exit 1.
expect_exit 0 "$DSB" compare "$WORK/a.json" "$WORK/b.json"
expect_stdout '^io\.seq\.pread\.warm +rate +[0-9.]+ [kMG]?B/s +[0-9.]+ [kMG]?B/s +[0-9.]+x'
expect_stdout 'io\.rand\.sample\.pread\.warm threads=1: only in A'
echo '{"schema_version": 1, "results": []}' >"$WORK/bad.json"
expect_exit 1 "$DSB" compare "$WORK/a.json" "$WORK/bad.json"
expect_stderr 'bad\.json: not a dsbench results file \(context is missing\)'
expect_exit 1 "$DSB" compare "$WORK/a.json" "$WORK/none.json"

finish
