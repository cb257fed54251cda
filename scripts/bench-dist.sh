#!/usr/bin/env bash
# Issue 17's single-GPU check of the NCCL path (when no multi-GPU machine is
# lent): training with an NCCL reducer of one rank against training without
# one, on one GPU, after a CUDA + NCCL build.
#  1. gpu_dist_nccl_test (the correctness tests): bit-equal weights with and
#     without the reducer, graph and eager steps, tf32 and bf16; a missing
#     rank's timeout; two ranks on two GPUs (skipped on one).
#  2. dstrain itself, ref-cnn, batch 256, TRAIN (50000) u8 3x32x32 samples in
#     GPU memory (--data device), tf32 and bf16: RUNS (3) fresh processes each
#     of plain `dstrain` and of `mpirun -np 1 dstrain` (the distributed path:
#     MPI, rendezvous, the NCCL reducer at N = 1; NCCL_NVLS_ENABLE=0),
#     interleaved (the first of each pair alternates): samples/s, the median
#     of each process's epochs after the first; the medians with min-max over
#     the processes and their ratio. Final weights compared bit for bit: each
#     pair of the default runs, and one more pair per precision with
#     --deterministic (cuDNN's deterministic algorithms, 2 epochs; the default
#     ones may differ between two plain runs already).
#  3. STEP_RUNS (2) fresh processes of gpu_dist_nccl_test's timing case: the
#     same model, batch and input type; the training step (input conversion +
#     graph) without a reducer and with the N = 1 NCCL reducer, interleaved
#     in 7 rounds of 150 steps, median per process; and one all-reduce of the
#     model's gradient vector (2.7 MB) at N = 1 on the compute stream, the
#     median over 60 groups of 20 calls.
#  4. Only with NP set (e.g. NP="2 4 8") on a machine with that many GPUs and
#     mpirun: dstrain under `mpirun -np N` (NCCL, NCCL_NVLS_ENABLE=0) against
#     one process, both on TRAIN x the largest N samples so that every rank
#     keeps full epochs: the world's samples/s and the scaling efficiency
#     (samples/s at N / (N x samples/s at 1)); one process group each.
# Logs go to LOG_DIR (default $OUT, else BIN_DIR/../logs)/dist; the table is
# printed last. Exit 1 when a step of part 1 or 3 fails.
# Usage: scripts/bench-dist.sh BIN_DIR [LOG_DIR]
#   RUNS (default 3), STEP_RUNS (2), TRAIN (50000), EPOCHS (6), NP (unset: no multi-GPU part)
set -uo pipefail
bin=${1:?usage: bench-dist.sh BIN_DIR [LOG_DIR]}
bin=$(cd "$bin" && pwd) || exit 1
log=${2:-${OUT:-$bin/../logs}}/dist
runs=${RUNS:-3} step_runs=${STEP_RUNS:-2} train=${TRAIN:-50000} epochs=${EPOCHS:-6}
mkdir -p "$log"
for f in dstrain dsgen gpu_dist_nccl_test; do
  [[ -x "$bin/$f" ]] || { echo "bench-dist: $bin/$f missing (build with -DDSTK_CUDA=ON and NCCL installed)" >&2; exit 1; }
done
command -v mpirun >/dev/null || { echo "bench-dist: no mpirun (Open MPI) on PATH" >&2; exit 1; }
work=$(mktemp -d /dev/shm/dstk-dist-XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_CACHE_HOME="$log/cache" # kernel choices: timed by the first process, reused by the others
status=0

# The samples/s of one dstrain run (the median of its epochs after the first) or nothing.
epoch_median() {
  python3 -c 'import json,sys,statistics as s; e=[x["samples_per_second"] for x in json.load(open(sys.argv[1]))["epochs"]]; print(f"{s.median(e[1:] or e):.0f}")' "$1" 2>/dev/null
}

# Passed means: exit 0 and at least one test run; the two-GPU test skips on one GPU.
if "$bin/gpu_dist_nccl_test" >"$log/correctness.log" 2>&1 && grep -Eq '^\[  PASSED  \] [1-9]' "$log/correctness.log"; then
  skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$log/correctness.log" | grep -v ' ms)$' | awk '{print $4}' | paste -sd, -)
  correct="passed, $(grep -c '^\[       OK \]' "$log/correctness.log") tests${skipped:+ (skipped: $skipped)}"
else
  correct="FAILED or skipped (see $log/correctness.log)"
  status=1
fi

"$bin/dsgen" "$work/u8" --train "$train" --test 1000 --shape 3x32x32 --dtype u8 --classes 10 --quiet || exit 1
: >"$log/runs.tsv" # kind <tab> precision <tab> process <tab> values
: >"$log/weights.tsv" # precision <tab> pair <tab> bit-equal|DIFFERENT
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
mpi1=(mpirun "${root[@]}" --bind-to none -np 1 -x NCCL_NVLS_ENABLE=0 -x XDG_CACHE_HOME)

# One dstrain process: KIND (plain, or mpi1: under mpirun -np 1) PRECISION TAG [more options],
# run_epochs of them (default EPOCHS); its samples/s go to runs.tsv, its weights to
# $work/KIND-PRECISION-TAG.safetensors.
dstrain_run() {
  local kind=$1 p=$2 tag=$3 launch=()
  shift 3
  [ "$kind" = mpi1 ] && launch=("${mpi1[@]}")
  local name="$kind-$p-$tag"
  "${launch[@]}" "$bin/dstrain" "$work/u8" --model ref-cnn --batch 256 --epochs "${run_epochs:-$epochs}" \
      --precision "$p" --device cuda:0 --data device --save "$work/$name.safetensors" --json "$@" \
      >"$log/$name.json" 2>"$log/$name.err" || return 1
  # The distributed path, not a plain run under mpirun.
  if [ "$kind" = mpi1 ] && ! grep -q 'data parallel: 1 rank (Open MPI).*NCCL' "$log/$name.err"; then
    echo "bench-dist: $name did not take the distributed path (see $log/$name.err)" >&2
    return 1
  fi
  printf '%s\t%s\t%s\t%s\n' "$kind" "$p" "$tag" "$(epoch_median "$log/$name.json")" >>"$log/runs.tsv"
}
# Whether two runs' saved weights are the same bytes, every tensor.
weights_equal() {
  python3 - "$work/plain-$1.safetensors" "$work/mpi1-$1.safetensors" <<'EOF_PY' 2>/dev/null
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]] for k, t in head.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
sys.exit(0 if a and a == b else 1)
EOF_PY
}
compare() { # PRECISION TAG LABEL
  local v=DIFFERENT
  weights_equal "$1-$2" && v=bit-equal
  printf '%s\t%s\t%s\n' "$1" "$3" "$v" >>"$log/weights.tsv"
}

for r in $(seq 1 "$runs"); do
  for p in tf32 bf16; do
    order=(plain mpi1)
    [ $((r % 2)) = 0 ] && order=(mpi1 plain)
    ok=1
    for k in "${order[@]}"; do dstrain_run "$k" "$p" "$r" || { ok=0; status=1; }; done
    [ "$ok" = 1 ] && compare "$p" "$r" default
  done
  [ "$r" -le "$step_runs" ] || continue
  "$bin/gpu_dist_nccl_test" --gtest_also_run_disabled_tests --gtest_filter='DistNcclBench.*' \
      >"$log/step-$r.log" 2>&1 || status=1
  awk -v r="$r" '$1 == "bench" && $3 == "plain_ms" { printf "step\t%s\t%s\t%s %s\n", $2, r, $4, $6 }
                 $1 == "bench" && $2 == "allreduce_us" { printf "allreduce\t-\t%s\t%s %s\n", r, $3, $5 }' \
      "$log/step-$r.log" >>"$log/runs.tsv"
done
# Bit-equality needs no timing: 2 epochs.
for p in tf32 bf16; do
  if run_epochs=2 dstrain_run plain "$p" det --deterministic && run_epochs=2 dstrain_run mpi1 "$p" det --deterministic; then
    compare "$p" det --deterministic
  else
    status=1
  fi
done

if [ -n "${NP:-}" ]; then
  largest=$(printf '%s\n' $NP | sort -n | tail -1)
  "$bin/dsgen" "$work/u8-multi" --train $((train * largest)) --test 1000 --shape 3x32x32 --dtype u8 --classes 10 \
      --quiet || exit 1
  for p in tf32 bf16; do
    for n in 1 $NP; do
      launch=(); [ "$n" -gt 1 ] && launch=(mpirun "${root[@]}" --bind-to none -np "$n" -x NCCL_NVLS_ENABLE=0)
      if "${launch[@]}" "$bin/dstrain" "$work/u8-multi" --model ref-cnn --batch 256 --epochs "$epochs" \
          --precision "$p" --device cuda --data device --json >"$log/multi-$p-$n.json" 2>"$log/multi-$p-$n.err"; then
        printf 'multi\t%s\t%s\t%s\n' "$p" "$n" "$(epoch_median "$log/multi-$p-$n.json")" >>"$log/runs.tsv"
      else
        status=1
      fi
    done
  done
fi

echo
echo "NCCL path at N = 1 on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), ref-cnn, batch 256, u8 3x32x32 in GPU memory"
echo "correctness (gpu_dist_nccl_test: bit-equal weights with and without the reducer): $correct"
python3 - "$log/runs.tsv" "$log/weights.tsv" "$epochs" <<'EOF'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
weights = [l.rstrip("\n").split("\t") for l in open(sys.argv[2]) if l.strip()]
print(f"{'precision':9s} {'process':>7s} {'step ms plain':>13s} {'step ms NCCL N=1':>16s} {'NCCL/plain':>10s}")
for p in ("tf32", "bf16"):
    ratios = []
    for proc in sorted({r[2] for r in rows if r[0] == "step" and r[1] == p}, key=int):
        s = [r[3].split() for r in rows if r[0] == "step" and r[1] == p and r[2] == proc]
        plain, nccl = float(s[0][0]), float(s[0][1])
        if plain: ratios.append(nccl / plain)
        print(f"{p:9s} {proc:>7s} {plain:13.4f} {nccl:16.4f} "
              f"{(f'{100 * nccl / plain:9.1f}%') if plain else '-':>10s}")
    if ratios:
        m = st.median(ratios)
        print(f"{p}: NCCL N=1 step time / plain, median of {len(ratios)} processes: {100 * m:.1f}% "
              f"({'within' if abs(m - 1) <= 0.02 else 'OUTSIDE'} +-2%); plain step = "
              f"{256e3 / st.median([float(r[3].split()[0]) for r in rows if r[0] == 'step' and r[1] == p]):.0f} samples/s")
multi = {(r[1], int(r[2])): float(r[3]) for r in rows if r[0] == "multi" and r[3]}
if multi:
    print(f"\n{'precision':9s} {'GPUs':>4s} {'world samples/s':>15s} {'scaling efficiency':>18s}  (dstrain, mpirun -np N)")
    for (p, n), v in sorted(multi.items(), key=lambda kv: (kv[0][0] != "tf32", kv[0][1])):
        one = multi.get((p, 1))
        print(f"{p:9s} {n:4d} {v:15.0f} {(f'{100 * v / (n * one):17.1f}%') if one else '-':>18s}")
ar = [r[3].split() for r in rows if r[0] == "allreduce"]
if ar:
    us = st.median(float(a[0]) for a in ar)
    print(f"all-reduce of the gradient vector ({int(ar[0][1]) / 1e6:.2f} MB float, N=1, in place, on the compute "
          f"stream): {us:.2f} us per call (median of {len(ar)} processes)")

# dstrain itself: plain against mpirun -np 1 (the timed runs have numeric tags).
def speeds(kind, p):
    return [float(r[3]) for r in rows if r[0] == kind and r[1] == p and r[2].isdigit() and r[3]]
def spread(v):
    return f"{st.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" if v else "-"
print(f"\ndstrain samples/s: median of epochs 2-{sys.argv[3]} per process, median (min-max) over fresh processes; "
      "plain vs mpirun -np 1 (MPI world of one, NCCL reducer)")
print(f"{'precision':9s} {'n':>2s} {'plain':>22s} {'mpirun -np 1':>22s} {'ratio':>7s}  final weights")
summary = []
for p in ("tf32", "bf16"):
    a, b = speeds("plain", p), speeds("mpi1", p)
    w = [x for x in weights if x[0] == p]
    default = [x[2] for x in w if x[1] == "default"]
    det = [x[2] for x in w if x[1] == "--deterministic"]
    wtext = (f"default flags: {default.count('bit-equal')}/{len(default)} pairs bit-equal; "
             f"--deterministic pair: {det[0] if det else 'not run'}")
    ratio = st.median(b) / st.median(a) if a and b else None
    print(f"{p:9s} {min(len(a), len(b)):2d} {spread(a):>22s} {spread(b):>22s} "
          f"{(f'{100 * ratio:6.1f}%') if ratio else '-':>7s}  {wtext}")
    if ratio:
        summary.append(f"{p}: dstrain mpirun -np 1 / plain {100 * ratio:.1f}% "
                       f"({'within' if abs(ratio - 1) <= 0.02 else 'OUTSIDE'} +-2%), --deterministic weights "
                       f"{'bit-equal' if det == ['bit-equal'] else 'NOT bit-equal'}")
print("\n".join(summary))
EOF
[ "$status" = 0 ] || echo "bench-dist: a step failed or was skipped: see the logs in $log" >&2
exit $status
