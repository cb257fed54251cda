#!/usr/bin/env bash
# dstrain against PyTorch on the same data, same model (ref-cnn), same batch,
# data already in GPU memory. Usage: scripts/bench-train.sh BUILD_DIR [WORK_DIR]
# Env: TRAIN (samples, default 50000), BATCH (256), EPOCHS (3), PRECISIONS ("tf32 bf16 fp32");
# bf16 is compared with PyTorch's bf16 autocast + channels_last.
# MEMMAP=1 (default) also runs the end-to-end comparison with the seeds' recipe:
# dstrain --data stream (tf32) against PyTorch fed by an np.memmap Dataset +
# DataLoader(shuffle, 4 workers, pin_memory), both reading the dataset files.
set -euo pipefail
build=${1:?usage: bench-train.sh BUILD_DIR [WORK_DIR]}
work=${2:-$(mktemp -d)}
mkdir -p "$work"
here=$(cd "$(dirname "$0")" && pwd)
train=${TRAIN:-50000} batch=${BATCH:-256} epochs=${EPOCHS:-3} precisions=${PRECISIONS:-"tf32 bf16 fp32"}
data="$work/bench-u8"
[[ -f "$data/dataset.json" ]] || "$build/bin/dsgen" "$data" --train "$train" --test 10000 --shape 3x32x32 --dtype u8 --classes 10 --quiet
declare -A ds torch_eager torch_compile
for p in $precisions; do
  "$build/bin/dstrain" "$data" --model ref-cnn --batch "$batch" --epochs "$epochs" --precision "$p" --device cuda:0 \
      --save "$work/model-$p.safetensors" --force --json > "$work/dstrain-$p.json"
  ds[$p]=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(int(max(e["samples_per_second"] for e in d["epochs"][1:] or d["epochs"])))' "$work/dstrain-$p.json")
  # PyTorch loads its own cuDNN: keep the system one out of the way.
  env -u LD_LIBRARY_PATH python3 "$here/torch_baseline.py" "$data" --batch "$batch" --epochs 2 --precision "$p" --json \
      > "$work/torch-$p.json"
  torch_eager[$p]=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["modes"]["eager"]))' "$work/torch-$p.json")
  torch_compile[$p]=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["modes"]["compile"]))' "$work/torch-$p.json")
done
printf '\nref-cnn, batch %s, %s samples 3x32x32 u8 in GPU memory (samples/s, best epoch)\n' "$batch" "$train"
printf '%-10s %14s %14s %16s %10s\n' precision dstrain torch-eager torch-compile "vs best"
for p in $precisions; do
  best=$(( torch_eager[$p] > torch_compile[$p] ? torch_eager[$p] : torch_compile[$p] ))
  printf '%-10s %14s %14s %16s %9sx\n' "$p" "${ds[$p]}" "${torch_eager[$p]}" "${torch_compile[$p]}" \
      "$(python3 -c "print(f'{${ds[$p]}/$best:.2f}')")"
done
if [ "${MEMMAP:-1}" != 0 ]; then
  "$build/bin/dstrain" "$data" --model ref-cnn --batch "$batch" --epochs "$epochs" --precision tf32 --device cuda:0 \
      --data stream --order full --save "$work/model-stream.safetensors" --force --json > "$work/dstrain-stream.json"
  stream=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(int(max(e["samples_per_second"] for e in d["epochs"][1:] or d["epochs"])))' "$work/dstrain-stream.json")
  env -u LD_LIBRARY_PATH python3 "$here/torch_baseline.py" "$data" --batch "$batch" --epochs 1 --precision tf32 \
      --modes memmap --json > "$work/torch-memmap.json"
  memmap=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["modes"]["memmap"]))' "$work/torch-memmap.json")
  printf '\nend to end from the dataset files, tf32, shuffled (samples/s)\n'
  printf '%-34s %10s\n' "dstrain --data stream --order full" "$stream" "torch np.memmap + DataLoader(4)" "$memmap"
  printf '%-34s %9sx\n' "ratio" "$(python3 -c "print(f'{$stream/$memmap:.2f}')")"
fi
