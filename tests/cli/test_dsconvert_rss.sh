#!/usr/bin/env bash
# dsconvert runs out of core: shuffling and zstd-compressing a ~2.1 GB dataset
# (4x the bound) peaks under 512 MiB RSS, and the copy reads back intact.
set -u
BIN=${DSTK_BIN:?DSTK_BIN must point to the bin/ directory of a build}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dstk-cli.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
[ -x "$BIN/dsgen" ] || { echo "SKIP: dsgen is not built" >&2; exit 77; }
PY=$(command -v python3 || command -v /usr/bin/python3)
free_kib=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }') # KiB: an integer, whatever the size
[ "$free_kib" -gt $((6 * 1024 * 1024)) ] || { echo "SKIP: needs 6 GiB free under $WORK" >&2; exit 77; }
fail=0
"$BIN/dsgen" "$WORK/big" --train 700K --test 0 -q || { echo "FAIL: dsgen" >&2; exit 1; }
read -r rc rss < <("$PY" - "$BIN/dsconvert" "$WORK/big" "$WORK/out" --shuffle 9 --compress zstd:1 -q <<'PY'
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
PY
)
size=$(stat -c %s "$WORK/big/train_x.npy")
echo "shuffled + compressed $size bytes with peak RSS $rss bytes"
[ "$rc" = 0 ] || { echo "FAIL: dsconvert exited $rc" >&2; fail=1; }
[ "$size" -gt $((4 * 512 * 1024 * 1024)) ] || { echo "FAIL: dataset not 4x the bound" >&2; fail=1; }
[ "$rss" -lt $((512 * 1024 * 1024)) ] || { echo "FAIL: peak RSS $rss over 512 MiB" >&2; fail=1; }
"$BIN/dsconvert" --verify "$WORK/out" -q >/dev/null || { echo "FAIL: --verify of the shuffled copy" >&2; fail=1; }
exit $fail
