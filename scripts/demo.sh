#!/usr/bin/env bash
# The README's main command: installs what is missing, builds into build/, then
# runs the bench-then-train workflow on a generated dataset:
#   dsgen (a learnable image dataset) -> dsplan (does it fit, where?) ->
#   dsbench (this machine's data path) -> dsconvert --verify -> dstrain ->
#   pictures (demo-out/curves.png, bench.png; TensorBoard events)
# On a machine with a GPU it trains ref-cnn on the GPU; otherwise small-cnn on
# the CPU, at a size that finishes in a few minutes.
#   DSTK_DEMO_DIR  where the outputs go (default: demo-out/ in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${DSTK_DEMO_DIR:-$root/demo-out}
scripts/setup.sh --demo

# The tools only (the tests are scripts/test.sh's); an earlier build is reused.
echo "== build (build/)"
source scripts/configure.sh
cmake --build build -j"$(nproc)" --target dsgen dsconvert dsplan dsbench dstrain
bin=$root/build/bin
mkdir -p "$out"

gpu=0
if "$bin/dsbench" --list 2>/dev/null | grep -q . && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
    grep -q 'CUDA' build-configure.log; then
    gpu=1
fi
if [ $gpu = 1 ]; then
    train=200K test=10K model=ref-cnn epochs=5 device=cuda
else
    train=20K test=2K model=small-cnn epochs=3 device=cpu
fi

run() { echo "+ $*" >&2; "$@"; }

echo "== 1. generate: $train training images (3x32x32 u8, 10 classes) into $out/data"
run "$bin/dsgen" "$out/data" --train "$train" --test "$test" --shape 3x32x32 --dtype u8 --force

echo "== 2. plan: does it fit this machine, and where?"
run "$bin/dsplan" --dataset "$out/data" --dir "$out" --model "$model" || true

echo "== 3. benchmark this machine's data path (short run) -> $out/bench.json"
run "$bin/dsbench" all "$out/data" --min-time 0.2 --json "$out/bench.json" --force || true

echo "== 4. verify the dataset's checksums"
run "$bin/dsconvert" --verify "$out/data"

echo "== 5. train $model on $device for $epochs epochs (log: $out/train.jsonl, TensorBoard: $out/tensorboard)"
rm -rf "$out/train.jsonl" "$out/tensorboard"
run "$bin/dstrain" "$out/data" --model "$model" --epochs "$epochs" --device "$device" --log-json "$out/train.jsonl" \
    --tensorboard "$out/tensorboard" --force

echo "== 6. pictures: the run's curves and where its time went -> $out/curves.png; the bench -> $out/bench.png"
py=
for p in "${DSTK_PYTHON:-}" python3 /usr/bin/python3; do
    [ -n "$p" ] && "$p" -c 'import matplotlib' >/dev/null 2>&1 && py=$p && break
done
[ -n "$py" ] || { echo "demo: no python3 with matplotlib (scripts/setup.sh --demo installs python3-matplotlib)" >&2; exit 3; }
run "$py" python/dstk/plot.py "$out/train.jsonl" -o "$out/curves.png" --force
[ -f "$out/bench.json" ] && run "$py" python/dstk/plot.py "$out/bench.json" -o "$out/bench.png" --force

echo
echo "outputs in $out:"
echo "  data/          the dataset (dataset.json + .npy files; numpy.load(..., mmap_mode='r') reads them)"
echo "  bench.json     dsbench's measurements of this machine"
echo "  train.jsonl    one JSON line per epoch of training"
echo "  curves.png     loss, accuracy, speed and where the time went, per epoch (python -m dstk.plot)"
echo "  bench.png      dsbench's rates against the disk's and PCIe's"
echo "  tensorboard/   TensorBoard event files (tensorboard --logdir $out/tensorboard)"
echo "  model.safetensors  the trained model (dstrain eval/predict --weights; PyTorch load_state_dict)"
