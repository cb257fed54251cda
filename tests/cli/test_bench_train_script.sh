# scripts/bench-train.sh's bookkeeping, on a stand-in dstrain that prints a
# run's --json (the real runs need a GPU): the summary's median of each run's
# epochs after the first, and each process's figure on stderr as it is
# measured, so that a run cut short by a time limit still shows what it measured.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 >/dev/null || skip "python3 is not installed"
[ -x "$BIN/dsgen" ] || skip "no dsgen binary in $BIN"

fake=$WORK/fake
mkdir -p "$fake/bin"
ln -s "$BIN/dsgen" "$fake/bin/dsgen"
# The stand-in: epochs at 1000, 2000 and 2200 samples/s (the figure: 2100); from
# its call number SLOW_FROM on, it first sleeps far past the test's time limit.
cat >"$fake/bin/dstrain" <<'SH'
#!/usr/bin/env bash
n=$(($(cat "$CALLS" 2>/dev/null || echo 0) + 1))
echo "$n" >"$CALLS"
[ "$n" -lt "${SLOW_FROM:-1000}" ] || sleep 60
echo '{"epochs":[{"samples_per_second":1000},{"samples_per_second":2000},{"samples_per_second":2200}]}'
SH
chmod +x "$fake/bin/dstrain"
export TRAIN=256 TORCH=0 JAX=0 MEMMAP=0 TASKS=cls PRECISIONS=tf32

CALLS=$WORK/calls1 RUNS=2 expect_exit 0 "$root/scripts/bench-train.sh" "$fake" "$WORK/w1"
expect_stdout '^dstrain tf32 +2 +2100 +2100 +2100 +100.0%'
expect_stderr "^bench-train: each process's log and figure in $WORK/w1"
expect_stderr $'^bench-train: dstrain tf32\t2100$'
expect_true "one line per process in runs.tsv" test "$(wc -l <"$WORK/w1/runs.tsv")" -eq 2

# Cut short in its second process: the first one's figure is on stderr already.
CALLS=$WORK/calls2 SLOW_FROM=2 RUNS=3 expect_exit 124 timeout 10 "$root/scripts/bench-train.sh" "$fake" "$WORK/w2"
expect_stderr $'^bench-train: dstrain tf32\t2100$'
expect_true "the first process's figure kept in runs.tsv" grep -q 2100 "$WORK/w2/runs.tsv"
finish
