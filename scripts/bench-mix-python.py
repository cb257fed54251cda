#!/usr/bin/env python3
"""A mix of datasets through dstk.Loader into a compiled PyTorch loop, against
the same loop on GPU-resident tensors (issue 25's second benchmark). One
process (run it inside the memory cgroup; scripts/bench-mix.sh does, with
WAYS=python), which prints one JSON line:

  reference  the PyTorch twin of ref-cnn (scripts/torch_baseline.py:
             torch.compile reduce-overhead, tf32) on the first member's
             normalised split in GPU memory, sliced into batches; timed for
             --seconds before and after the mix, the mean of both turns
  mix        the same compiled step fed by dstk.Loader(members, weights=...,
             placement=[...], output="torch"), --epochs whole epochs, each
             timed from the first batch asked for to the last step done
             (the restart between epochs included); the figure is the mean
             of the epochs after the first (the first reads the host-kept
             members from disk)

plus the process's RSS before the loader was built and its peak (VmHWM)
after: the growth against the members' sources' planned host memory (rings,
window caches; the loader's printed host ceiling, loader.host_bytes, counts
the host-kept members' page cache besides).

    python3 scripts/bench-mix-python.py --members m0,m1,m2,m3 --weights 4,3,2,1 \\
        --placement host,host,stream,stream --host-mem 3G --epochs 3
    python3 scripts/bench-mix-python.py --summarise py1.json py2.json py3.json
"""
import argparse, json, os, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def status_bytes(key):
    """A /proc/self/status figure (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def worker(a):
    import numpy as np
    import torch
    sys.path.insert(0, HERE)
    from torch_baseline import compiled_ref_cnn
    import dstk

    members = a.members.split(",")
    ds = dstk.open(members[0])
    step, mean, std = compiled_ref_cnn(ds)
    xf, yf = ds["train"]["x"].numpy(), ds["train"]["y"].numpy()
    n, b = len(yf), a.batch
    # The first member on the GPU, copied in pieces (no host copy of the whole split).
    x = torch.empty((n,) + tuple(xf.shape[1:]), dtype=torch.float32, device="cuda")
    for i in range(0, n, 65536):
        x[i:i + 65536] = torch.from_numpy(np.asarray(xf[i:i + 65536])).cuda().float().sub_(mean).div_(std)
    y = torch.from_numpy(np.asarray(yf)).cuda().long()

    def reference(seconds):
        k = n // b
        for i in range(30):
            step(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b])
        torch.cuda.synchronize()
        t0, done = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            i = done % k
            step(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b])
            done += 1
        torch.cuda.synchronize()
        return done * b / (time.perf_counter() - t0)

    turns = [reference(a.seconds)]
    rss_before = status_bytes("VmRSS")
    loader = dstk.Loader(members, weights=[float(w) for w in a.weights.split(",")],
                         placement=a.placement.split(","), host_mem=int(a.host_mem) if a.host_mem else None, batch=b, order="chunk", seed=0,
                         device="cuda:0", output="torch")
    epochs = []
    for _ in range(a.epochs):
        torch.cuda.synchronize()
        t0, samples = time.perf_counter(), 0
        for xb, yb in loader:
            step(xb, yb)
            samples += yb.shape[0]
        torch.cuda.synchronize()
        epochs.append({"samples": samples, "seconds": time.perf_counter() - t0,
                       "read_wait": loader.times.get("read_wait")})
    peak = status_bytes("VmHWM")
    turns.append(reference(a.seconds))
    rates = [e["samples"] / e["seconds"] for e in epochs]
    print(json.dumps({"reference": statistics.fmean(turns), "reference_turns": turns,
                      "mix": statistics.fmean(rates[1:]) if len(rates) > 1 else None, "mix_epochs": epochs,
                      "rss_before": rss_before, "peak_rss": peak, "host_ceiling": loader.host_bytes,
                      "data_path_bytes": sum(m["source"]["host_bytes"] for m in loader.plan["mix"]["members"]),
                      "plan": loader.describe()}))


def summarise(files):
    runs = [json.load(open(f)) for f in files]
    mix = [r["mix"] for r in runs]
    ref = [r["reference"] for r in runs]
    ratio = [100 * r["mix"] / r["reference"] for r in runs]
    print(f"python mix ({len(runs)} processes): dstk.Loader on the mix {statistics.median(mix):,.0f} samples/s "
          f"[{min(mix):,.0f}-{max(mix):,.0f}], compiled step on GPU-resident tensors "
          f"{statistics.median(ref):,.0f} [{min(ref):,.0f}-{max(ref):,.0f}]: "
          f"{statistics.median(ratio):.1f}% [{min(ratio):.1f}-{max(ratio):.1f}] (target >= 95%)")
    for i, r in enumerate(runs):
        secs = ", ".join(f"{e['seconds']:.2f} s (read wait {e['read_wait'] or 0:.2f})" for e in r["mix_epochs"])
        growth, data = r["peak_rss"] - r["rss_before"], r["data_path_bytes"]
        print(f"  process {i + 1}: epochs {secs}; RSS {r['rss_before'] / 2**20:.0f} MiB before the loader, "
              f"peak {r['peak_rss'] / 2**20:.0f} MiB (+{growth / 2**20:.0f} MiB) against the members' sources "
              f"{data / 2**20:.0f} MiB: " + ("within" if growth <= data else
                                             f"over by {(growth - data) / 2**20:.0f} MiB (the process grew beside them)")
              + f"; the loader's host ceiling {r['host_ceiling'] / 2**20:.0f} MiB counts the host-kept members' "
              "page cache too")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", help="the mix's datasets, comma-separated (the first is the reference's)")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--placement", default=None)
    ap.add_argument("--host-mem", default=None, help="the mix's host budget in bytes")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--summarise", nargs="+", metavar="JSON")
    a = ap.parse_args()
    if a.summarise:
        return summarise(a.summarise)
    if not a.members or not a.weights or not a.placement:
        ap.error("--members, --weights and --placement are needed (or --summarise)")
    worker(a)


if __name__ == "__main__":
    main()
