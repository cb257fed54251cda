#!/usr/bin/env python3
"""PyTorch reads dstrain's saved model: loads MODEL.safetensors into the
PyTorch twin (scripts/torch_baseline.py: a function named after the preset,
ref_cnn for ref-cnn), with load_state_dict(strict=True), computes the test
accuracy of DATASET in fp32 eval mode, and compares it with `dstrain eval
--json`'s (EVAL.json): they must agree within --tolerance percentage points.
Reads the file with the safetensors package when installed, else with numpy
and struct (tests/python/model_support.py). Prints one line; exit 1 on a
mismatch. Usage: model_check.py DATASET MODEL.safetensors EVAL.json"""
import argparse
import json
import os
import pathlib
import sys

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "python"))
import model_support  # noqa: E402
import torch_baseline  # noqa: E402


def load_tensors(path):
    try:
        from safetensors.torch import load_file
        from safetensors import safe_open
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        return load_file(str(path)), meta, "safetensors"
    except ImportError:
        t, meta = model_support.read_safetensors(path)
        return {k: torch.from_numpy(np.array(v)) for k, v in t.items()}, meta, "numpy reader"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("model")
    ap.add_argument("eval_json")
    ap.add_argument("--tolerance", type=float, default=0.1, help="percentage points")
    a = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    state, meta, reader = load_tensors(a.model)
    c, h, w = (int(d) for d in meta["input_shape"].split("x"))
    classes = int(meta["classes"])
    twin = getattr(torch_baseline, meta["model_name"].replace("-", "_"), None)
    if twin is None:
        sys.exit(f"model-check: no PyTorch twin '{meta['model_name']}' in scripts/torch_baseline.py")
    net = twin(c, classes, h, w)
    net.load_state_dict(state, strict=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    net = net.to(dev).eval()
    x = model_support.split_array(a.dataset)
    y = model_support.split_array(a.dataset, "label_field").astype(np.int64)
    mean = torch.tensor(json.loads(meta["normalize_mean"])).view(1, -1, 1, 1).to(dev)
    std = torch.tensor(json.loads(meta["normalize_std"])).view(1, -1, 1, 1).to(dev)
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1024):
            xb = torch.from_numpy(np.asarray(x[i:i + 1024], dtype=np.float32)).view(-1, c, h, w).to(dev)
            pred = net((xb - mean) / std).argmax(1).cpu().numpy()
            correct += int((pred == y[i:i + 1024]).sum())
    torch_acc = 100.0 * correct / len(x)
    ours = 100.0 * json.load(open(a.eval_json))["accuracy"]
    ok = abs(torch_acc - ours) <= a.tolerance
    print(f"model-check {'ok' if ok else 'MISMATCH'}: {meta['model_name']} PyTorch {torch.__version__} ({reader}, "
          f"{dev}) test acc {torch_acc:.2f}% vs dstrain eval {ours:.2f}% (tolerance {a.tolerance} points)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
