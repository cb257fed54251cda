#!/usr/bin/env bash
# dstrain's CPU trainer beside its PyTorch twin (scripts/torch_baseline.py
# --modes curve): the same dataset, network, initialisation (bit for bit), batch
# order (dstrain --order sequential), optimiser, schedule and BN settings.
# Prints both curves side by side, per case; logs go to OUTDIR.
#
# usage: scripts/compare-torch-cpu.sh DATA OUTDIR [DSTRAIN-OPTIONS...]
#   DATA     a dataset directory with train and test splits, or a folder of
#            MNIST IDX .gz files (converted into OUTDIR/data, 80/20 split)
#   options  dstrain's names (--model --batch --epochs --lr --optimizer
#            --momentum --no-nesterov --weight-decay --schedule --warmup-epochs
#            --step-epochs --gamma --label-smoothing --seed --threads), given to
#            both sides; none: three small-cnn cases (defaults; --batch 64;
#            --batch 64 --lr 0.05 --schedule constant)
# env: DSTK_BIN (folder with dstrain and dsconvert; default build/bin, else
#      PATH), TWIN_DEVICE (cpu, the default, or cuda), PYTHON (python3)
# On the GPU machine: TWIN_DEVICE=cuda scripts/compare-torch-cpu.sh ../shared/data/mnist "$OUT"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: $0 DATA OUTDIR [DSTRAIN-OPTIONS...]" >&2; exit 2; }
data=$1 out=$2
shift 2
bin=${DSTK_BIN:-$here/../build/bin}
[ -x "$bin/dstrain" ] || bin=$(dirname "$(command -v dstrain)")
py=${PYTHON:-python3}
device=${TWIN_DEVICE:-cpu}
mkdir -p "$out"
if [ ! -f "$data/dataset.json" ]; then
  [ -f "$out/data/dataset.json" ] || "$bin/dsconvert" "$data" "$out/data" --split train=0.8,test=0.2 -q
  data=$out/data
fi

run_case() { # name, options...
  local name=$1
  shift
  "$bin/dstrain" "$data" --device cpu --order sequential --log-json "$out/$name.dstrain.jsonl" "$@" \
    > "$out/$name.dstrain.txt" 2>&1
  env -u LD_LIBRARY_PATH "$py" "$here/torch_baseline.py" "$data" --modes curve --device "$device" --json "$@" \
    > "$out/$name.torch.json" 2> "$out/$name.torch.txt"
  "$py" - "$out/$name.dstrain.jsonl" "$out/$name.torch.json" "$*" <<'EOF'
import json, sys
d = [j for j in map(json.loads, open(sys.argv[1])) if j.get("event") == "epoch"]
t = json.load(open(sys.argv[2]))["modes"]["curve"]
print(f"\n{sys.argv[3] or '(defaults)'}")
print(f"{'epoch':>5} | {'loss dstrain':>12} {'torch':>8} | {'train% dstrain':>14} {'torch':>7} | "
      f"{'test% dstrain':>13} {'torch':>7}")
for a, b in zip(d, t):
    print(f"{a['epoch']:>5} | {a['train_loss']:>12.4f} {b['train_loss']:>8.4f} | {100 * a['train_accuracy']:>14.2f} "
          f"{100 * b['train_accuracy']:>7.2f} | {100 * a['test_accuracy']:>13.2f} {100 * b['test_accuracy']:>7.2f}")
EOF
}

if [ $# -gt 0 ]; then
  run_case custom "$@"
else
  run_case default --model small-cnn
  run_case b64 --model small-cnn --batch 64
  run_case b64-lr05-constant --model small-cnn --batch 64 --lr 0.05 --schedule constant
fi
