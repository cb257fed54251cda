#!/usr/bin/env bash
# Per-operation GPU times of dstrain's training step (MODEL, ref-cnn by default; data in GPU
# memory), from the cuda backend's DSTK_PROFILE_LAYERS mode: each operation of
# STEPS un-graphed steps timed with CUDA events, then the graph's step time and
# the run's best-epoch samples/s, the input conversion's time, the kernel
# choices and the per-step loop breakdown (DSTK_STEP_TIMES). Usage: scripts/profile-train.sh BUILD_DIR [WORK_DIR]
# Env: MODEL (preset or spec, ref-cnn), TRAIN (samples, 50000), BATCH (256), EPOCHS (2), STEPS (20),
# PRECISIONS ("fp32 tf32 bf16"), DSTRAIN_ARGS (extra dstrain options), TAG (file suffix).
set -euo pipefail
build=${1:?usage: profile-train.sh BUILD_DIR [WORK_DIR]}
work=${2:-$(mktemp -d)}
mkdir -p "$work"
model=${MODEL:-ref-cnn} train=${TRAIN:-50000} batch=${BATCH:-256} epochs=${EPOCHS:-2} steps=${STEPS:-20}
precisions=${PRECISIONS:-"fp32 tf32 bf16"} tag=${TAG:-}
data="$work/bench-u8"
[[ -f "$data/dataset.json" ]] || "$build/bin/dsgen" "$data" --train "$train" --test 10000 --shape 3x32x32 --dtype u8 --classes 10 --quiet
for p in $precisions; do
  # shellcheck disable=SC2086
  DSTK_STEP_TIMES=1 DSTK_PROFILE_LAYERS=$steps "$build/bin/dstrain" "$data" --model "$model" --batch "$batch" --epochs "$epochs" \
      --precision "$p" --device cuda:0 --save "$work/model-$p$tag.safetensors" --force --json ${DSTRAIN_ARGS:-} > "$work/dstrain-$p$tag.json" 2> "$work/profile-$p$tag.txt"
  best=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(int(max(e["samples_per_second"] for e in d["epochs"][1:] or d["epochs"])))' "$work/dstrain-$p$tag.json")
  printf '\n== %s%s: best epoch %s samples/s\n' "$p" "$tag" "$best"
  grep -E '^profile: (sum|input conversion|L[0-9]+ conv)|kernels|per step' "$work/profile-$p$tag.txt" | cut -c1-300 || true
  sed -n '/^profile: top operations/,/^profile: L/p' "$work/profile-$p$tag.txt" | grep -v '^profile: L' | head -9
done
