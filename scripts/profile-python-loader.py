#!/usr/bin/env python3
"""Where a compiled PyTorch step fed by dstk.Loader spends its time, beside the
same step on GPU-resident tensors (the reference of bench-python-loader.py).

For each way, after a warm-up, --steps steps are timed three ways: the wall
time per step; the CPU time in taking the batch (the loader's next, DeviceArray,
from_dlpack, labels to int64) and in calling the compiled step (launching its
CUDA graph); and the GPU time of the step from CUDA events on the consumer's
stream. A step whose GPU time is well under its wall time is bound by the CPU,
and then every microsecond of hand-off adds to the step.

    python3 scripts/profile-python-loader.py DATASET [--steps 300]
"""
import argparse, os, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, HERE)
    from torch_baseline import build_model
    import dstk

    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    ds = dstk.open(a.dataset)
    xf, yf = ds["train"]["x"], ds["train"]["y"]
    n, (c, h, w) = xf.samples, xf.sample_shape
    mean = torch.tensor(ds.manifest["stats"]["mean"], device="cuda").view(1, c, 1, 1)
    std = torch.tensor(ds.manifest["stats"]["std"], device="cuda").view(1, c, 1, 1)
    torch.manual_seed(0)
    model = build_model("ref-cnn", (c, h, w), ds.manifest.get("num_classes", 10))[0].cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=True)

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    step = torch.compile(step, mode="reduce-overhead")
    model.train()

    def forever(make):
        while True:
            yield from make()

    def measure(name, it):
        for _ in range(40):
            step(*next(it))
        torch.cuda.synchronize()
        take, launch, gpu = [], [], []
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(a.steps)]
        t0 = time.perf_counter()
        for i in range(a.steps):
            c0 = time.perf_counter()
            xb, yb = next(it)
            c1 = time.perf_counter()
            events[i][0].record()
            step(xb, yb)
            events[i][1].record()
            c2 = time.perf_counter()
            take.append(c1 - c0)
            launch.append(c2 - c1)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.steps
        gpu = [s.elapsed_time(e) / 1e3 for s, e in events]
        us = lambda v: f"{1e6 * statistics.median(v):7.0f}"
        print(f"{name:10s} wall/step {1e6 * wall:7.0f} us  take {us(take)}  launch {us(launch)}  "
              f"gpu {us(gpu)} us (medians)  {a.batch / wall:10,.0f} samples/s", flush=True)

    x = torch.from_numpy(np.array(xf.numpy())).cuda().float().sub_(mean).div_(std)
    y = torch.from_numpy(np.array(yf.numpy())).cuda().long()
    k = n // a.batch
    measure("reference", forever(lambda: ((x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch])
                                          for i in range(k))))
    loader = dstk.Loader(a.dataset, batch=a.batch, order="chunk", seed=0, placement="stream", device="cuda:0")
    measure("dstk", forever(lambda: ((torch.from_dlpack(xb), torch.from_dlpack(yb).long()) for xb, yb in loader)))
    # The hand-off's parts, without training: the loader's next alone, then with DLPack.
    it = iter(forever(lambda: loader))
    for name, f in (("next", lambda: next(it)),
                    ("+dlpack", lambda: [torch.from_dlpack(v) for v in next(it)]),
                    ("+long", lambda: (lambda b: (torch.from_dlpack(b[0]), torch.from_dlpack(b[1]).long()))(next(it)))):
        for _ in range(50):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            f()
        torch.cuda.synchronize()
        print(f"  hand-off {name:8s} {1e6 * (time.perf_counter() - t0) / a.steps:7.0f} us a batch", flush=True)
    measure("reference", forever(lambda: ((x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch])
                                          for i in range(k))))


if __name__ == "__main__":
    main()
