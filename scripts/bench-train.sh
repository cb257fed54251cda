#!/usr/bin/env bash
# dstrain against PyTorch on the same data, same model (ref-cnn), same batch,
# data already in GPU memory, each configuration in RUNS fresh processes
# (dstrain and PyTorch alternating), reported as min / median / max.
# TASKS (default "cls reg heads"; "" for none, e.g. with CURVE): cls, ref-cnn's classification (MODEL: another
# preset or spec for cls, its PyTorch twin too); reg, the same
# network regressing a float target of 10 values (mse); heads, ref-cnn's trunk
# with two heads (cls=fc:10>ce:y, value=fc:1,tanh>mse:v). reg and heads train
# on the same images with their targets added (bench-heads/), and the summary
# gives each beside cls (dstk's target: >= 95%) and beside PyTorch (>= 1.5x).
# Usage: scripts/bench-train.sh BUILD_DIR [WORK_DIR]
# Each process's figure goes to stderr as it is measured ("bench-train: CONFIG<TAB>samples/s"),
# its logs stay in WORK_DIR (default: a new temporary directory, named on stderr first).
# Env: TRAIN (samples, default 50000), BATCH (256), EPOCHS (3), PRECISIONS ("tf32 bf16 fp32"),
#      RUNS (fresh processes per configuration, default 5, at least 5 for the check),
#      TORCH (1: also PyTorch eager and compile; 0: dstrain only), TORCH_RUNS (default RUNS),
#      JAX (1, the default where python3 has jax and TORCH is not 0: also the JAX twin, scripts/jax_baseline.py,
#      for the cls task, TORCH_RUNS processes), CHECK (1: exit 1 when a dstrain configuration's slowest run is
#      below 95% of its median).
# A dstrain run's figure is the median of its epochs after the first; a PyTorch
# run's is torch_baseline.py's figure per mode. bf16 is compared with PyTorch's
# bf16 autocast + channels_last.
# BASELINE=BUILD_DIR: also ref-cnn classification by that build's dstrain (another
# tree, built in the same call), alternating with this one, and the ratio of
# their medians: a change's effect measured on the same machine instance.
# Each build then keeps its kernel choices in a cache of its own under
# WORK_DIR (XDG_CACHE_HOME): the cache is kept per GPU, cuDNN and kernel set,
# not per tree, so one build's timing would otherwise decide for both.
# CURVE="128 256 512 1024": also a batch-size curve of MODEL's classification,
# data on the GPU, per precision: dstrain (RUNS fresh processes per point), the
# PyTorch twin compiled (torch.compile, CUDA graphs; TORCH_RUNS processes per
# point, none with TORCH=0) and the JAX twin (steps fused with lax.scan,
# scripts/jax_baseline.py; TORCH_RUNS processes, each timing every batch size;
# none with JAX=0 or where python3 has no jax); printed as medians with min-max.
# MEMMAP=1 (default) also runs the end-to-end comparison with the seeds' recipe
# once: dstrain --data stream (tf32) against PyTorch fed by an np.memmap Dataset
# + DataLoader(shuffle, 4 workers, pin_memory), both reading the dataset files.
set -euo pipefail
build=${1:?usage: bench-train.sh BUILD_DIR [WORK_DIR]}
work=${2:-$(mktemp -d)}
mkdir -p "$work"
here=$(cd "$(dirname "$0")" && pwd)
train=${TRAIN:-50000} batch=${BATCH:-256} epochs=${EPOCHS:-3} precisions=${PRECISIONS:-"tf32 bf16 fp32"}
model=${MODEL:-ref-cnn} runs=${RUNS:-5} torch=${TORCH:-1} torch_runs=${TORCH_RUNS:-${RUNS:-5}} tasks=${TASKS-"cls reg heads"}
have_jax=0
env -u LD_LIBRARY_PATH python3 -c 'import jax' 2>/dev/null && have_jax=1
jax=${JAX:-$([ "$torch" != 0 ] && echo "$have_jax" || echo 0)}
if [ "$jax" != 0 ] && [ "$have_jax" = 0 ]; then
  echo "bench-train: JAX=$jax, but python3 has no jax (pip install 'jax[cuda12]'), or set JAX=0" >&2
  exit 2
fi
# jax_figure JSON BATCH: the JAX twin's samples/s at BATCH from its --json output.
jax_figure() {
  python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["batches"][sys.argv[2]]))' "$1" "$2"
}
data="$work/bench-u8"
[[ -f "$data/dataset.json" ]] || "$build/bin/dsgen" "$data" --train "$train" --test 10000 --shape 3x32x32 --dtype u8 --classes 10 --quiet
# The same images with float targets: r, the label one-hot as f32[10]; v, the label mapped to [-1, 1].
heads_data="$work/bench-heads"
if [[ " $tasks " == *" reg "* || " $tasks " == *" heads "* ]] && [[ ! -f "$heads_data/dataset.json" ]]; then
  python3 - "$data" "$work/bench-heads.npz" <<'EOF'
import json, os, sys
import numpy as np
src, out = sys.argv[1], sys.argv[2]
meta = json.load(open(os.path.join(src, "dataset.json")))
arrays = {}
for sp in meta["splits"]:
    f = {x["name"]: x for x in sp["fields"]}
    x = np.load(os.path.join(src, f[meta["input_field"]]["file"]))
    y = np.load(os.path.join(src, f[meta["label_field"]]["file"])).astype(np.int32)
    arrays.update({f"x_{sp['name']}": x, f"y_{sp['name']}": y, f"r_{sp['name']}": np.eye(10, dtype=np.float32)[y],
                   f"v_{sp['name']}": (y / 4.5 - 1).astype(np.float32)})
np.savez(out, **arrays)
EOF
  "$build/bin/dsconvert" "$work/bench-heads.npz" "$heads_data" --num-classes 10 --quiet
  rm -f "$work/bench-heads.npz"
fi
trunk="conv3x3:32,bn,relu,conv3x3:32,bn,relu,maxpool2,conv3x3:64,bn,relu,conv3x3:64,bn,relu,maxpool2,conv3x3:128,bn,relu,maxpool2,flatten,fc:256,relu"
# task_args TASK: sets args, the dataset and the model options dstrain and torch_baseline.py both take.
task_args() {
  case $1 in
  cls) args=("$data" --model "$model") ;;
  reg) args=("$heads_data" --model ref-cnn --label r --loss mse) ;;
  heads) args=("$heads_data" --model "$trunk,heads(cls=fc:10>ce:y, value=fc:1,tanh>mse:v)") ;;
  esac
}
export DSTK_STEP_TIMES=${DSTK_STEP_TIMES:-1} # the per-step breakdown in each run's log
results="$work/runs.tsv" # configuration <tab> samples/s, one line per process
: >"$results"
# Each process's figure also to stderr as it is measured, so that a run cut
# short (a time limit, Ctrl-C) still shows what it measured; the logs stay in WORK_DIR.
echo "bench-train: each process's log and figure in $work" >&2
record() { # FILE FIELDS...: one tab-separated line into FILE, and to stderr
  local f=$1; shift
  (IFS=$'\t'; printf '%s\n' "$*" >>"$f"; printf 'bench-train: %s\n' "$*" >&2)
}

# The median of a dstrain run's epochs after the first (all epochs when there is one).
epoch_median() {
  python3 -c 'import json,sys,statistics as s; e=[x["samples_per_second"] for x in json.load(open(sys.argv[1]))["epochs"]]; print(int(s.median(e[1:] or e)))' "$1"
}

# With BASELINE, a kernel-choice cache per build (XDG_CACHE_HOME must be absolute).
own_cache=() base_cache=()
if [ -n "${BASELINE:-}" ]; then
  work_abs=$(cd "$work" && pwd)
  own_cache=(env XDG_CACHE_HOME="$work_abs/choices-build") base_cache=(env XDG_CACHE_HOME="$work_abs/choices-baseline")
fi

for r in $(seq 1 "$runs"); do
  for p in $precisions; do
    for t in $tasks; do
      task_args "$t"
      name=dstrain; [ "$t" = cls ] || name="dstrain-$t"
      "${own_cache[@]}" "$build/bin/dstrain" "${args[@]}" --batch "$batch" --epochs "$epochs" --precision "$p" --device cuda:0 \
          --save "$work/model-$t-$p-$r.safetensors" --force --json >"$work/$name-$p-$r.json" 2>"$work/$name-$p-$r.err"
      record "$results" "$name $p" "$(epoch_median "$work/$name-$p-$r.json")"
      if [ -n "${BASELINE:-}" ] && [ "$t" = cls ]; then
        "${base_cache[@]}" "$BASELINE/bin/dstrain" "${args[@]}" --batch "$batch" --epochs "$epochs" --precision "$p" --device cuda:0 \
            --save "$work/model-base-$p-$r.safetensors" --force --json >"$work/base-$p-$r.json" 2>"$work/base-$p-$r.err"
        record "$results" "dstrain-base $p" "$(epoch_median "$work/base-$p-$r.json")"
      fi
      if [ "$torch" != 0 ] && [ "$r" -le "$torch_runs" ]; then
        # PyTorch loads its own cuDNN: keep the system one out of the way.
        env -u LD_LIBRARY_PATH python3 "$here/torch_baseline.py" "${args[@]}" --batch "$batch" --epochs 2 \
            --precision "$p" --json >"$work/torch-$t-$p-$r.json" 2>"$work/torch-$t-$p-$r.err"
        for mode in eager compile; do
          tname="torch-$mode"; [ "$t" = cls ] || tname="torch-$mode-$t"
          record "$results" "$tname $p" \
              "$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["modes"][sys.argv[2]]))' "$work/torch-$t-$p-$r.json" "$mode")"
        done
      fi
      if [ "$jax" != 0 ] && [ "$t" = cls ] && [ "$r" -le "$torch_runs" ]; then
        env -u LD_LIBRARY_PATH python3 "$here/jax_baseline.py" "$data" --model "$model" --batches "$batch" \
            --precision "$p" --json >"$work/jax-$p-$r.json" 2>"$work/jax-$p-$r.err"
        record "$results" "jax-scan $p" "$(jax_figure "$work/jax-$p-$r.json" "$batch")"
      fi
    done
  done
done

if [ -n "$tasks" ]; then
  printf '\n%s, batch %s, %s samples 3x32x32 u8 in GPU memory, %s fresh processes each (samples/s)\n' \
      "$model" "$batch" "$train" "$runs"
  python3 - "$results" "$precisions" "$tasks" <<'EOF'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    conf, v = line.rstrip("\n").split("\t")
    rows.setdefault(conf, []).append(float(v))
print(f"{'configuration':22s} {'runs':>4s} {'min':>10s} {'median':>10s} {'max':>10s} {'min/median':>10s}")
for conf, v in rows.items():
    m = st.median(v)
    print(f"{conf:22s} {len(v):4d} {min(v):10.0f} {m:10.0f} {max(v):10.0f} {100 * min(v) / m:9.1f}%")
print()
for t in sys.argv[3].split():
    sfx = "" if t == "cls" else f"-{t}"
    for p in sys.argv[2].split():
        d = rows.get(f"dstrain{sfx} {p}")
        best = max([st.median(rows[k]) for k in (f"torch-eager{sfx} {p}", f"torch-compile{sfx} {p}") if k in rows],
                   default=0)
        if d and best:
            print(f"dstrain{sfx} {p} median / PyTorch's best median: {st.median(d) / best:.2f}x")
        twins = [st.median(rows[k]) for k in (f"torch-compile{sfx} {p}", f"jax-scan{sfx} {p}") if k in rows]
        if d and len(twins) == 2:
            print(f"dstrain{sfx} {p} median / the best twin's median (PyTorch compile, JAX): {st.median(d) / max(twins):.2f}x")
        c = rows.get(f"dstrain {p}")
        if d and c and t != "cls":
            print(f"dstrain{sfx} {p} median / dstrain (ref-cnn classification) median: "
                  f"{100 * st.median(d) / st.median(c):.1f}%")
for p in sys.argv[2].split():
    d, base = rows.get(f"dstrain {p}"), rows.get(f"dstrain-base {p}")
    if d and base:
        print(f"dstrain {p} median / the baseline build's median: {100 * st.median(d) / st.median(base):.1f}%")
t, b = rows.get("dstrain tf32"), rows.get("dstrain bf16")
if t and b:
    print(f"dstrain bf16 median / tf32 median: {st.median(b) / st.median(t):.2f}x")
EOF
fi

if [ "${MEMMAP:-1}" != 0 ] && [ "$torch" != 0 ]; then
  "$build/bin/dstrain" "$data" --model ref-cnn --batch "$batch" --epochs "$epochs" --precision tf32 --device cuda:0 \
      --data stream --order full --save "$work/model-stream.safetensors" --force --json > "$work/dstrain-stream.json"
  stream=$(epoch_median "$work/dstrain-stream.json")
  env -u LD_LIBRARY_PATH python3 "$here/torch_baseline.py" "$data" --batch "$batch" --epochs 1 --precision tf32 \
      --modes memmap --json > "$work/torch-memmap.json"
  memmap=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["modes"]["memmap"]))' "$work/torch-memmap.json")
  printf '\nend to end from the dataset files, tf32, shuffled (samples/s, one process each)\n'
  printf '%-34s %10s\n' "dstrain --data stream --order full" "$stream" "torch np.memmap + DataLoader(4)" "$memmap"
  printf '%-34s %9sx\n' "ratio" "$(python3 -c "print(f'{$stream/$memmap:.2f}')")"
fi

if [ -n "${CURVE:-}" ]; then
  curve="$work/curve.tsv"
  : >"$curve"
  for p in $precisions; do
    for b in $CURVE; do
      for r in $(seq 1 "$runs"); do
        "$build/bin/dstrain" "$data" --model "$model" --batch "$b" --epochs "$epochs" --precision "$p" --device cuda:0 \
            --save "$work/model-curve.safetensors" --force --json >"$work/curve-$b-$p-$r.json" 2>"$work/curve-$b-$p-$r.err"
        record "$curve" dstrain "$p" "$b" "$(epoch_median "$work/curve-$b-$p-$r.json")"
        if [ "$torch" != 0 ] && [ "$r" -le "$torch_runs" ]; then
          env -u LD_LIBRARY_PATH python3 "$here/torch_baseline.py" "$data" --model "$model" --batch "$b" --epochs 2 \
              --precision "$p" --modes compile --json >"$work/curve-torch-$b-$p-$r.json" 2>"$work/curve-torch-$b-$p-$r.err"
          record "$curve" torch-compile "$p" "$b" \
              "$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["modes"]["compile"]))' "$work/curve-torch-$b-$p-$r.json")"
        fi
      done
    done
    # The JAX twin times every batch size in one process (one compilation per size).
    for r in $(seq 1 "$torch_runs"); do
      [ "$jax" != 0 ] || break
      env -u LD_LIBRARY_PATH python3 "$here/jax_baseline.py" "$data" --model "$model" --batches "$(echo "$CURVE" | tr ' ' ,)" \
          --precision "$p" --json >"$work/curve-jax-$p-$r.json" 2>"$work/curve-jax-$p-$r.err"
      for b in $CURVE; do
        record "$curve" jax-scan "$p" "$b" "$(jax_figure "$work/curve-jax-$p-$r.json" "$b")"
      done
    done
  done
  printf '\nbatch-size curve, %s, data on the GPU (samples/s, median [min-max] of fresh processes: dstrain %s, twins %s)\n' \
      "$model" "$runs" "$torch_runs"
  python3 - "$curve" <<'EOF'
import sys, statistics as st
v = {}
for line in open(sys.argv[1]):
    who, p, b, x = line.split()
    v.setdefault((p, int(b), who), []).append(float(x))
def cell(x):
    return f"{st.median(x) / 1e3:.1f}k [{min(x) / 1e3:.1f}-{max(x) / 1e3:.1f}]" if x else "-"
print(f"{'precision':9s} {'batch':>6s} {'dstrain':>24s} {'torch-compile':>24s} {'jax-scan':>24s} {'dstrain/best':>13s}")
for p, b in sorted({(p, b) for p, b, _ in v}):
    d, t, j = (v.get((p, b, w), []) for w in ("dstrain", "torch-compile", "jax-scan"))
    best = max([st.median(x) for x in (t, j) if x], default=0)
    ratio = f"{st.median(d) / best:.2f}x" if d and best else "-"
    print(f"{p:9s} {b:6d} {cell(d):>24s} {cell(t):>24s} {cell(j):>24s} {ratio:>13s}")
EOF
fi

# The regression check of issue 18: every fresh dstrain process within 5% of
# the median of its configuration.
if [ "${CHECK:-1}" != 0 ]; then
  python3 - "$results" <<'EOF'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    conf, v = line.rstrip("\n").split("\t")
    rows.setdefault(conf, []).append(float(v))
bad = []
for conf, v in rows.items():
    if conf.startswith("dstrain") and min(v) < 0.95 * st.median(v):
        bad.append(f"{conf}: slowest run {min(v):.0f} samples/s is {100 * min(v) / st.median(v):.1f}% of the median "
                   f"{st.median(v):.0f} (runs: {', '.join(f'{x:.0f}' for x in v)})")
if bad:
    print("\nbench-train: FAILED the reproducibility check (slowest run >= 95% of the median):", file=sys.stderr)
    for b in bad:
        print("  " + b, file=sys.stderr)
    print("  the runs' logs (dstrain-*.err, with DSTK_STEP_TIMES=1 the per-step breakdown) are in the work directory",
          file=sys.stderr)
    sys.exit(1)
print("\nbench-train: every dstrain run within 5% of its configuration's median")
EOF
fi
