#!/usr/bin/env bash
# Each tool's --help and its man page document the same options: every option
# in --help (dsbench: and in its subcommands' --help) has an entry in
# man/TOOL.1, and every option a man page names is one the tool has (or, in a
# cross-reference, one a sibling tool has); no text line of a page starts
# with a dot (troff would drop it).
source "$(dirname "$0")/lib.sh"
MAN_DIR="${DSTK_SOURCE_DIR:?}/man"
[ -d "$MAN_DIR" ] || skip "no $MAN_DIR"
TOOLS=(dsgen dsconvert dsplan dsbench dstrain)
for t in "${TOOLS[@]}"; do
    [ -x "$BIN/$t" ] || skip "no $t binary in $BIN"
done

# help_options TOOL: long options of --help ("  -m,--model TEXT", "  --lr FLOAT"), subcommands included.
help_options() {
    local t=$1 sub
    {
        "$BIN/$t" --help
        for sub in $("$BIN/$t" --help | awk '/^Subcommands:/ { f = 1; next } f && /^  [a-z]/ { print $1 }'); do
            "$BIN/$t" "$sub" --help
        done
    } | grep -Eo '^  (-[A-Za-z],)?--[a-z][a-z0-9-]*' | sed 's/.*--/--/' | sort -u
}
# man_options FILE [entries]: options a man page names ("\-\-name"); with
# "entries", only those on the first line of a .TP item.
man_options() {
    if [ "${2:-}" = entries ]; then awk '/^\.TP/ { getline; print }' "$1"; else cat "$1"; fi |
        grep -Eo '\\-\\-[a-z0-9]+(\\-[a-z0-9]+)*' | sed 's/\\-/-/g' | sort -u
}

for t in "${TOOLS[@]}"; do
    CHECKS=$((CHECKS + 1))
    help_options "$t" >"$WORK/help-$t.txt" || fail "$t --help failed"
    [ -s "$WORK/help-$t.txt" ] || fail "$t --help lists no options"
done
sort -u "$WORK"/help-*.txt >"$WORK/help-any.txt"
for t in "${TOOLS[@]}"; do
    man="$MAN_DIR/$t.1"
    expect_true "man page $man exists" test -f "$man"
    man_options "$man" entries >"$WORK/entries-$t.txt"
    man_options "$man" >"$WORK/named-$t.txt"
    missing=$(comm -23 "$WORK/help-$t.txt" "$WORK/entries-$t.txt" | tr '\n' ' ')
    expect_true "options in $t --help without an entry in man/$t.1: $missing" test -z "$missing"
    unknown=$(comm -13 "$WORK/help-any.txt" "$WORK/named-$t.txt" | tr '\n' ' ')
    expect_true "options named in man/$t.1 that no tool has: $unknown" test -z "$unknown"
    foreign=$(comm -23 "$WORK/entries-$t.txt" "$WORK/help-$t.txt" | tr '\n' ' ')
    expect_true "entries in man/$t.1 for options $t does not have: $foreign" test -z "$foreign"
    # A text line that starts with a dot (".npy file ...") is read as a
    # request and dropped from the page: escape it as \&.npy. The pages use
    # only the man macros (upper case) and these requests.
    stray=$(grep -nE '^\.[a-z]' "$man" | grep -vE '^[0-9]+:\.(br|fi|nf)$' | cut -d: -f1 | tr '\n' ' ')
    expect_true "lines of man/$t.1 that start with a dot but are no request (escape them with \\&): $stray" \
        test -z "$stray"
done
finish
