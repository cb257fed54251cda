# No function over ~100 lines in lib/, tools/ and python/ (scripts/check-function-length.py),
# after a check that the checker finds a long function and a stale exemption.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 >/dev/null 2>&1 || skip "no python3"
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
expect_exit 1 python3 "$check" --root "$WORK/tree" --exempt "$WORK/none.txt"
expect_stdout '^lib/x.cpp:2: long_one is 104 lines'
echo 'lib/x.cpp:long_one # a generated table' >"$WORK/exempt.txt"
expect_exit 0 python3 "$check" --root "$WORK/tree" --exempt "$WORK/exempt.txt"
echo 'lib/x.cpp:short_one # no longer long' >>"$WORK/exempt.txt"
expect_exit 1 python3 "$check" --root "$WORK/tree" --exempt "$WORK/exempt.txt"
expect_stdout "'lib/x.cpp:short_one' is exempt but is no longer"

expect_exit 0 python3 "$check" --root "$root"
expect_stdout '^no function over 100 lines'
finish
