# No function over ~100 lines in lib/, tools/ and python/ (scripts/check-function-length.py, lizard),
# after a check that the checker finds a long function and a stale exemption.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
# lizard measures the functions: build/venv has it (scripts/setup.sh --test).
py=
for p in "$root/build/venv/bin/python" python3; do
    "$p" -c 'import lizard' >/dev/null 2>&1 && py=$p && break
done
[ -n "$py" ] || skip "lizard is not installed (scripts/setup.sh --test puts it in build/venv)"
check="$root/scripts/check-function-length.py"

mkdir -p "$WORK/tree/lib"
{
    echo 'namespace n {'
    echo 'int long_one(int a) {'
    for i in $(seq 1 101); do echo "    a += $i;"; done
    echo '    return a;'
    echo '}'
    echo 'int short_one() { return 1; }'
    echo '}'
} >"$WORK/tree/lib/x.cpp"
: >"$WORK/none.txt"
expect_exit 1 "$py" "$check" --root "$WORK/tree" --exempt "$WORK/none.txt"
expect_stdout '^lib/x.cpp:2: long_one is 104 lines'
echo 'lib/x.cpp:long_one # a generated table' >"$WORK/exempt.txt"
expect_exit 0 "$py" "$check" --root "$WORK/tree" --exempt "$WORK/exempt.txt"
echo 'lib/x.cpp:short_one # no longer long' >>"$WORK/exempt.txt"
expect_exit 1 "$py" "$check" --root "$WORK/tree" --exempt "$WORK/exempt.txt"
expect_stdout "'lib/x.cpp:short_one' is exempt but is no longer"

expect_exit 0 "$py" "$check" --root "$root"
expect_stdout '^no function over 100 lines'
finish
