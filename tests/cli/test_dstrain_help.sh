#!/usr/bin/env bash
# dstrain --help and man/dstrain.1 document the same options: every option in
# --help has an entry in the man page, and every option the man page names is
# one dstrain has.
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
MAN="${DSTK_SOURCE_DIR:?}/man/dstrain.1"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -f "$MAN" ] || skip "no $MAN"

expect_exit 0 "$DSTRAIN" --help
# Long options of --help: "  -m,--model TEXT", "  --lr FLOAT", "  --resume".
grep -Eo '^  (-[A-Za-z],)?--[a-z][a-z0-9-]*' "$OUT" | sed 's/.*--/--/' | sort -u >"$WORK/help.txt"
# Options the man page names ("\-\-name").
grep -Eo '\\-\\-[a-z0-9]+(\\-[a-z0-9]+)*' "$MAN" | sed 's/\\-/-/g' | sort -u >"$WORK/man-all.txt"
# Entries of the man page: option names on .TP items' first line (.B, .BI, .BR).
awk '/^\.TP/ { getline; print }' "$MAN" | grep -Eo '\\-\\-[a-z0-9]+(\\-[a-z0-9]+)*' | sed 's/\\-/-/g' |
    sort -u >"$WORK/man-entries.txt"

missing=$(comm -23 "$WORK/help.txt" "$WORK/man-entries.txt" | tr '\n' ' ')
expect_true "options in --help without an entry in man/dstrain.1: $missing" test -z "$missing"
unknown=$(comm -13 "$WORK/help.txt" "$WORK/man-all.txt" | tr '\n' ' ')
expect_true "options named in man/dstrain.1 that dstrain does not have: $unknown" test -z "$unknown"
finish
