#!/usr/bin/env python3
"""The same model as dstrain's ref-cnn in PyTorch, on the same dataset, with the
whole training split already in GPU memory: eager and torch.compile
(reduce-overhead, CUDA graphs) modes. --precision bf16 is PyTorch's mixed
precision: bf16 autocast with channels_last tensors, fp32 master weights.
Mode "memmap" is the seeds' recipe instead: the split read through an np.memmap
Dataset by DataLoader(shuffle, 4 workers, pin_memory), batches copied with
non_blocking, eager training: the end-to-end baseline for dstrain's stream
placement. Prints one line per mode and, with --json, one JSON document. Run on
the GPU machine's python3."""
import argparse, json, os, sys, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def ref_cnn(in_ch, classes, h, w):
    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]
    layers = block(in_ch, 32) + block(32, 32) + [nn.MaxPool2d(2)] + block(32, 64) + block(64, 64) + \
        [nn.MaxPool2d(2)] + block(64, 128) + [nn.MaxPool2d(2), nn.Flatten(),
                                              nn.Linear(128 * (h // 8) * (w // 8), 256), nn.ReLU(inplace=True),
                                              nn.Linear(256, classes)]
    return nn.Sequential(*layers)


def load(dataset, split):
    meta = json.load(open(os.path.join(dataset, "dataset.json")))
    sp = next(s for s in meta["splits"] if s["name"] == split)
    fields = {f["name"]: f for f in sp["fields"]}
    x = np.load(os.path.join(dataset, fields[meta.get("input_field", "x")]["file"]), mmap_mode="r")
    y = np.load(os.path.join(dataset, fields[meta.get("label_field", "y")]["file"]), mmap_mode="r")
    dtype = fields[meta.get("input_field", "x")]["dtype"]
    return np.array(x), np.asarray(y).astype(np.int64), dtype, meta.get("num_classes", int(y.max()) + 1)


def to_float(x, dtype):
    t = torch.from_numpy(x)
    if dtype == "bf16":
        t = t.view(torch.int16).view(torch.bfloat16)
    elif dtype == "f16":
        t = t.view(torch.float16)
    return t.cuda().float()


def run(mode, x, y, classes, batch, epochs, lr, bf16):
    torch.manual_seed(0)
    n, c, h, w = x.shape
    model = ref_cnn(c, classes, h, w).cuda()
    if bf16:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4,
                          fused=(mode != "eager"))

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    if mode == "compile":
        step = torch.compile(step, mode="reduce-overhead")
    steps = n // batch
    model.train()
    for i in range(min(steps, 30)):  # warm-up (compilation, cuDNN autotune)
        step(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch])
    torch.cuda.synchronize()
    rates = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for i in range(steps):
            step(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch])
        torch.cuda.synchronize()
        rates.append(steps * batch / (time.perf_counter() - t0))
    return max(rates)


class MemmapSamples(torch.utils.data.Dataset):
    """One sample per item from the .npy files, opened lazily in each worker."""

    def __init__(self, xpath, ypath):
        self.xpath, self.ypath, self.x = xpath, ypath, None
        self.n = np.load(ypath, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.x is None:
            self.x = np.load(self.xpath, mmap_mode="r")
            self.y = np.load(self.ypath, mmap_mode="r")
        return torch.from_numpy(np.array(self.x[i])), int(self.y[i])


def run_memmap(dataset, dtype, classes, mean, std, batch, epochs, lr, bf16, workers=4):
    meta = json.load(open(os.path.join(dataset, "dataset.json")))
    sp = next(s for s in meta["splits"] if s["name"] == "train")
    fields = {f["name"]: f for f in sp["fields"]}
    xpath = os.path.join(dataset, fields[meta.get("input_field", "x")]["file"])
    ypath = os.path.join(dataset, fields[meta.get("label_field", "y")]["file"])
    loader = torch.utils.data.DataLoader(MemmapSamples(xpath, ypath), batch_size=batch, shuffle=True,
                                         num_workers=workers, pin_memory=True, drop_last=True,
                                         persistent_workers=True)
    torch.manual_seed(0)
    c, h, w = np.load(xpath, mmap_mode="r").shape[1:]
    model = ref_cnn(c, classes, h, w).cuda()
    if bf16:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    model.train()
    rates = []
    for epoch in range(epochs + 1):  # the first epoch warms up workers and cuDNN autotune
        t0, seen = time.perf_counter(), 0
        for xb, yb in loader:
            xb = to_float_gpu(xb.cuda(non_blocking=True), dtype)
            xb = (xb - mean) / std
            if bf16:
                xb = xb.contiguous(memory_format=torch.channels_last)
            yb = yb.cuda(non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            seen += xb.shape[0]
        torch.cuda.synchronize()
        if epoch > 0:
            rates.append(seen / (time.perf_counter() - t0))
    return max(rates)


def to_float_gpu(t, dtype):
    if dtype == "bf16":
        t = t.view(torch.int16).view(torch.bfloat16)
    elif dtype == "f16":
        t = t.view(torch.float16)
    return t.float()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dataset")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="tf32")
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile, memmap")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tf32 = a.precision in ("tf32", "bf16")
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    x, y, dtype, classes = load(a.dataset, "train")
    xg = to_float(x, dtype)
    c = xg.shape[1]
    mean = xg.mean(dim=(0, 2, 3), keepdim=True)
    std = xg.std(dim=(0, 2, 3), keepdim=True)
    xg = ((xg - mean) / std).contiguous()
    yg = torch.from_numpy(y).cuda()
    out = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
           "batch": a.batch, "precision": a.precision, "samples": int(xg.shape[0]), "modes": {}}
    for mode in a.modes.split(","):
        if mode == "memmap":
            r = run_memmap(a.dataset, dtype, classes, mean, std, a.batch, a.epochs, a.lr, a.precision == "bf16")
        else:
            r = run(mode, xg, yg, classes, a.batch, a.epochs, a.lr, a.precision == "bf16")
        out["modes"][mode] = r
        print(f"torch {mode:8s} {r:12,.0f} samples/s", file=sys.stderr if a.json else sys.stdout, flush=True)
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
