#!/usr/bin/env bash
# On the GPU machine: train ref-cnn a few epochs on dsgen data shaped like
# MNIST, `dstrain eval` the saved model, then PyTorch loads the same file into
# its twin (scripts/torch_baseline.py) and must reach the same test accuracy
# within 0.1 point (scripts/model_check.py). Under 2 minutes on an H100.
#   scripts/model-check.sh BIN_DIR WORK_DIR [LOG_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1 work=$2 log=${3:-$2}
mkdir -p "$work" "$log"
# Noisier than the default so that the accuracy is far from 100% and a wrong
# tensor layout could not hide.
"$bin/dsgen" "$work/data" --train 30K --test 5K --shape 1x28x28 --classes 10 --seed 1 --noise 0.6 --force -q
"$bin/dstrain" "$work/data" --model ref-cnn --epochs 3 --save "$work/model.safetensors" --force \
    --log-json "$log/model-check-train.jsonl"
# The comparison in fp32 on both sides (PyTorch's TF32 is off in model_check.py);
# the eval in the precision the model was trained in (tf32) is printed too.
"$bin/dstrain" eval "$work/data" --weights "$work/model.safetensors" --precision fp32 --json \
    >"$log/model-check-eval.json"
"$bin/dstrain" eval "$work/data" --weights "$work/model.safetensors" | sed -n 1,3p
# PyTorch loads its own cuDNN: keep the system one out of the way.
env -u LD_LIBRARY_PATH python3 scripts/model_check.py "$work/data" "$work/model.safetensors" "$log/model-check-eval.json"
