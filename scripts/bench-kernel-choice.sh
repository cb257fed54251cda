#!/usr/bin/env bash
# Issue 18's check on a GPU machine, after a build (scripts/gpu-test.sh runs it
# as the bench step "kernel-choice"): ref-cnn, batch 256, 50k u8 samples in GPU
# memory, 3 epochs, RUNS fresh dstrain processes per precision, tf32 and bf16
# alternating, starting from an EMPTY kernel choice cache (the first process
# times and stores, the others reuse). Each run logs its epoch lines with the
# per-step breakdown (DSTK_STEP_TIMES=1) and its kernel choices; the slowest
# and the fastest bf16 process are shown side by side (with the layer profile
# of one more process of each speed when the speeds differ by more than 10%),
# then a table: min / median / max per precision, the bf16/tf32 ratio of the
# medians, and the check "slowest >= 95% of the median" (exit 1 when it fails).
# Usage: scripts/bench-kernel-choice.sh [BUILD_DIR] [LOG_DIR]
#   RUNS (default 10), TRAIN (50000), EPOCHS (3), BATCH (256)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-gpu}
log=${2:-${OUT:-$build/logs}}/kernel-choice
runs=${RUNS:-10} train=${TRAIN:-50000} epochs=${EPOCHS:-3} batch=${BATCH:-256}
mkdir -p "$log"
work=$(mktemp -d /dev/shm/dstk-kc-XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_CACHE_HOME="$log/cache" # empty: the first process after the build times everything
rm -rf "$XDG_CACHE_HOME"
export DSTK_STEP_TIMES=1
data="$work/u8"
"$build/bin/dsgen" "$data" --train "$train" --test 10000 --shape 3x32x32 --dtype u8 --classes 10 --quiet || exit 1
: >"$log/runs.tsv"
for r in $(seq 1 "$runs"); do
  for p in tf32 bf16; do
    name="$p-$r"
    # The GPU's clocks, power and throttle reasons while the run trains (a
    # power or clock cap would slow every kernel alike, inside the graph too).
    smi=""
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
          --format=csv,noheader -lms 250 >"$log/$name.smi" 2>/dev/null &
      smi=$!
    fi
    "$build/bin/dstrain" "$data" --model ref-cnn --batch "$batch" --epochs "$epochs" --precision "$p" \
        --device cuda:0 --log-json "$log/$name.jsonl" --save "$log/model-$name.safetensors" --force \
        >"$log/$name.out" 2>"$log/$name.err"
    rc=$?
    [ -n "$smi" ] && kill "$smi" 2>/dev/null && wait "$smi" 2>/dev/null
    v=$(python3 -c '
import json, sys, statistics as s
e = [j["samples_per_second"] for j in map(json.loads, open(sys.argv[1])) if j.get("event") == "epoch"]
print(int(s.median(e[1:] or e)))' "$log/$name.jsonl" 2>/dev/null || echo 0)
    printf '%s\t%s\t%s\t%s\n' "$p" "$r" "$v" "$rc" >>"$log/runs.tsv"
    echo "$name: $v samples/s (rc $rc)" >&2
  done
done

echo "== kernel choices of the first bf16 process (empty cache) and the second (cache)"
grep -h "kernels" "$log/bf16-1.err" | cut -c1-200 | head -8
grep -h "kernels" "$log/bf16-2.err" | cut -c1-200 | head -8

# The slowest and the fastest bf16 process: their epoch lines with the per-step breakdown.
read -r slow fast spread < <(python3 - "$log/runs.tsv" <<'EOF'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.startswith("bf16")]
rows = [(int(r[2]), r[1]) for r in rows if int(r[2]) > 0]
rows.sort()
print(rows[0][1], rows[-1][1], f"{rows[-1][0] / max(1, rows[0][0]):.3f}") if rows else print("0 0 0")
EOF
)
echo "== slowest bf16 process (run $slow) and fastest (run $fast)"
for r in $slow $fast; do
  echo "-- run $r"
  grep -h "^epoch\|step:" "$log/bf16-$r.out" "$log/bf16-$r.err" 2>/dev/null | cut -c1-400
  [ -s "$log/bf16-$r.smi" ] && python3 - "$log/bf16-$r.smi" <<'EOF'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
busy = [r for r in rows if r[3].split()[0].replace(".", "", 1).isdigit() and float(r[3].split()[0]) > 100]
if busy:
    sm = sorted(float(r[1].split()[0]) for r in busy)
    pw = sorted(float(r[3].split()[0]) for r in busy)
    print(f"   GPU while busy (>100 W, {len(busy)} samples): SM clock median {sm[len(sm) // 2]:.0f} MHz "
          f"(min {sm[0]:.0f}), power median {pw[len(pw) // 2]:.0f} W, throttle reasons {sorted(set(r[5].strip() for r in busy))}")
EOF
done
if python3 -c "import sys; sys.exit(0 if float('$spread') > 1.10 else 1)"; then
  echo "== bf16 speeds differ by ${spread}x: the layer profile of two more processes"
  for k in 1 2; do
    DSTK_PROFILE_LAYERS=3 "$build/bin/dstrain" "$data" --model ref-cnn --batch "$batch" --epochs 1 --precision bf16 \
        --device cuda:0 --save "$log/model-profile-$k.safetensors" --force >"$log/profile-$k.out" 2>"$log/profile-$k.err"
    grep -h "graph step\|input conversion\|^epoch" "$log/profile-$k.out" "$log/profile-$k.err" | cut -c1-400
  done
fi

echo
python3 - "$log/runs.tsv" <<'EOF'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    p, r, v, rc = line.rstrip("\n").split("\t")
    rows.setdefault(p, []).append(float(v))
print(f"ref-cnn batch 256, 50k u8 in GPU memory, fresh processes (samples/s, median epoch after the first)")
print(f"{'precision':10s} {'runs':>4s} {'min':>10s} {'median':>10s} {'max':>10s} {'min/median':>10s}  check")
failed = False
for p, v in rows.items():
    m = st.median(v)
    ok = min(v) >= 0.95 * m
    failed |= not ok
    print(f"{p:10s} {len(v):4d} {min(v):10.0f} {m:10.0f} {max(v):10.0f} {100 * min(v) / m:9.1f}%  "
          f"{'ok' if ok else 'FAIL: slowest < 95% of median'}")
if "tf32" in rows and "bf16" in rows:
    print(f"bf16/tf32 (medians): {st.median(rows['bf16']) / st.median(rows['tf32']):.2f}x  (target >= 1.35x)")
print("all runs (precision, run, samples/s):", ", ".join(
    f"{p}#{i + 1} {x:.0f}" for p, v in rows.items() for i, x in enumerate(v)))
sys.exit(1 if failed else 0)
EOF
