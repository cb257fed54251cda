#!/usr/bin/env bash
# dsgen runs out of core: generating ~2.1 GB (4x the bound) peaks under 512 MiB RSS.
. "$(dirname "$0")/lib.sh"
run_measuring_rss "$BIN/dsgen" "$WORK/big" --train 700K --test 0 -q
rss=$RSS_BYTES
CHECKS=$((CHECKS + 1))
[ "$RSS_RC" = 0 ] || fail "dsgen exited $RSS_RC"
size=$(stat -c %s "$WORK/big/train_x.npy")
echo "generated $size bytes with peak RSS $rss bytes"
expect_true "dataset larger than 4x the RSS bound" test "$size" -gt $((4 * 512 * 1024 * 1024))
expect_true "peak RSS $rss under 512 MiB" test "$rss" -lt $((512 * 1024 * 1024))
finish
