#!/usr/bin/env python3
"""Where a compiled PyTorch step fed by dstk.Loader spends its time, beside the
same step on GPU-resident tensors (the reference of bench-python-loader.py).

Each way is timed over --steps steps after a warm-up: the wall time per step;
the CPU time in taking the batch (for dstk: the loader's next, DeviceArray,
from_dlpack, labels to int64) and in calling the compiled step (launching its
CUDA graph); and the GPU time of the step from CUDA events on the consumer's
stream. A step whose GPU time is well under its wall time is bound by the
CPU, and then every microsecond of hand-off adds to the step. The ways:

  reference        slices of the normalised split in GPU memory, int64 labels
  reference+busy   the reference with 200 us of busy CPU in each take (CPU- or GPU-bound?)
  reference+long   the same with int32 labels made int64 in each step
  dstk             for x, y in Loader: from_dlpack(x), from_dlpack(y).long()
  dstk-torch       for x, y in Loader(output="torch"): tensors over the slots, int64 labels
  handoff-only     the dstk hand-off taken, but the step fed the reference's slices
  ref+feeder       the reference fed, batches taken from the torch loader (no stream wait)
  ref+wait         the same, the stream made to wait for each batch
  dstk-parts       the dstk hand-off in its parts, each timed

    python3 scripts/profile-python-loader.py DATASET [--steps 300]
"""
import argparse, os, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ways", default="", help="comma-separated ways to time (default: all, then the hand-off alone)")
    a = ap.parse_args()

    import numpy as np
    import torch
    sys.path.insert(0, HERE)
    from torch_baseline import compiled_ref_cnn
    import dstk

    ds = dstk.open(a.dataset)
    xf, yf = ds["train"]["x"], ds["train"]["y"]
    n = xf.samples
    step, mean, std = compiled_ref_cnn(ds)

    def forever(make):
        while True:
            yield from make()

    results = {}

    def measure(name, it, feed=None):
        for _ in range(40):
            b = next(it)
            step(*(feed() if feed else b))
        torch.cuda.synchronize()
        take, launch = [], []
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(a.steps)]
        t0 = time.perf_counter()
        for i in range(a.steps):
            c0 = time.perf_counter()
            xb, yb = next(it)
            if feed:
                xb, yb = feed()
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
        us = lambda v: f"{1e6 * statistics.median(v):6.0f}"
        results.setdefault(name, []).append(a.batch / wall)
        print(f"{name:15s} wall/step {1e6 * wall:6.0f} us  take {us(take)}  launch {us(launch)}  "
              f"gpu {us(gpu)} us (medians)  {a.batch / wall:9,.0f} samples/s", flush=True)

    x = torch.from_numpy(np.array(xf.numpy())).cuda().float().sub_(mean).div_(std)
    y = torch.from_numpy(np.array(yf.numpy())).cuda().long()
    y32 = y.int()
    k = n // a.batch
    ref = lambda: forever(lambda: ((x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch])
                                   for i in range(k)))
    ref_long = lambda: forever(lambda: ((x[i * a.batch:(i + 1) * a.batch], y32[i * a.batch:(i + 1) * a.batch].long())
                                        for i in range(k)))

    def ref_busy():
        # The reference with 200 us of extra CPU work in each take: the wall
        # time grows by it where the loop is bound by the CPU, not where the GPU is.
        for b in ref():
            t = time.perf_counter() + 200e-6
            while time.perf_counter() < t:
                pass
            yield b

    loader = dstk.Loader(a.dataset, batch=a.batch, order="chunk", seed=0, placement="stream", device="cuda:0")
    parts = {}

    def split_take():
        # The DLPack hand-off in its parts, each timed: the C++ next, the two
        # DeviceArray objects, the two from_dlpack calls (with wait_ready), .long().
        impl = loader._impl
        while True:
            impl.start_epoch(0, 0)
            while True:
                t0 = time.perf_counter()
                b = impl.next()
                t1 = time.perf_counter()
                if b is None:
                    break
                xa, ya = loader._device_arrays(*b)
                t2 = time.perf_counter()
                tx, ty = torch.from_dlpack(xa), torch.from_dlpack(ya)
                t3 = time.perf_counter()
                ty = ty.long()
                t4 = time.perf_counter()
                for name, v in (("next", t1 - t0), ("arrays", t2 - t1), ("from_dlpack", t3 - t2), ("long", t4 - t3)):
                    parts.setdefault(name, []).append(v)
                yield tx, ty

    plain = lambda: forever(lambda: ((torch.from_dlpack(xb), torch.from_dlpack(yb).long()) for xb, yb in loader))
    fast_loader = dstk.Loader(a.dataset, batch=a.batch, order="chunk", seed=0, placement="stream",
                              device="cuda:0", output="torch")
    fast = lambda: forever(lambda: fast_loader)
    def side_takes(wait):
        # Batches taken from the torch-output loader (the stream made to wait
        # for each where `wait`), the step fed the reference's slices: what
        # the loader's threads and the wait cost without the data dependency.
        impl, current = fast_loader._impl, torch.cuda.current_stream
        while True:
            impl.start_epoch(0, 0)
            while impl.next(current().cuda_stream if wait else -1) is not None:
                yield None, None

    ways = {
        "reference": lambda: (ref(), None),
        "reference+busy": lambda: (ref_busy(), None),
        "reference+long": lambda: (ref_long(), None),
        "dstk": lambda: (plain(), None),
        "dstk-torch": lambda: (fast(), None),
        "handoff-only": lambda: (plain(), ref()),
        "ref+feeder": lambda: (side_takes(False), ref()),
        "ref+wait": lambda: (side_takes(True), ref()),
        "dstk-parts": lambda: (split_take(), None),
    }
    chosen = a.ways.split(",") if a.ways else list(ways)
    for r in range(a.rounds):
        for name in chosen:
            it, feed = ways[name]()
            parts.clear()
            measure(name, it, feed=(lambda f=feed: next(f)) if feed else None)
            if name == "dstk-parts":
                print("  parts (median us): " + ", ".join(f"{k} {1e6 * statistics.median(v):.1f}"
                                                         for k, v in parts.items()))
    if a.ways:
        base = statistics.median(results["reference"])
        print("summary (median over rounds, of reference):",
              ", ".join(f"{k} {statistics.median(v) / base:.1%}" for k, v in results.items()))
        return
    # The hand-off's parts, without training: the loader's next alone, then with DLPack.
    it = iter(forever(lambda: loader))
    hand = [("next", lambda: next(it)),
             ("+dlpack", lambda: [torch.from_dlpack(v) for v in next(it)]),
             ("+long", lambda: (lambda b: (torch.from_dlpack(b[0]), torch.from_dlpack(b[1]).long()))(next(it)))]
    fi = iter(fast())
    hand.append(("torch", lambda: next(fi)))
    for name, f in hand:
        for _ in range(50):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            f()
        torch.cuda.synchronize()
        print(f"  hand-off {name:8s} {1e6 * (time.perf_counter() - t0) / a.steps:7.1f} us a batch", flush=True)
    base = statistics.median(results["reference"])
    print("summary (median over rounds, of reference):",
          ", ".join(f"{k} {statistics.median(v) / base:.1%}" for k, v in results.items()))


if __name__ == "__main__":
    main()
