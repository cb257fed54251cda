#!/usr/bin/env python3
"""dstk.Loader inside a PyTorch loop, on the GPU machine (PyTorch, the dstk
package installed). The PyTorch twin of ref-cnn (scripts/torch_baseline.py;
torch.compile reduce-overhead = CUDA graphs, tf32), batch 256, u8 3x32x32, the
same compiled step fed three ways in each process:

  reference  the normalised split already in GPU memory (slices)
  dstk       dstk.Loader(placement="stream", order="chunk", output="torch"):
             readers, pinned ring, copy stream, conversion (and int64
             labels) on the GPU, torch tensors over the loader's slots
  dlpack     the same loader with output="arrays": DeviceArray batches through
             torch.from_dlpack, labels made int64 by .long()
  memmap     the seeds' recipe: np.memmap Dataset + DataLoader(shuffle,
             4 workers, pin_memory), normalised on the GPU

--runs fresh processes (default 3). In each, the ways take turns: reference,
dstk, dlpack, memmap, loader, then --pairs more turns of reference and dstk
(default 3; the step's own rate drifts by several percent over a process's
life, and alternating spreads that over both), each timed for --seconds
(default 4, several epochs) after a warm-up, so that a drift of the GPU or the
process over its life falls on both; a way's rate in a process is the mean of
its turns. The table gives the median samples/s with min and max, the median
of the per-process ratio dstk / reference (the figure the target is about),
dstk as a multiple of memmap, and the loader's printed ceilings beside the GPU
memory it took and the process's peak RSS. --cgroup-limit L (root, cgroup v2)
adds one run of dstk and memmap on a dataset 4x L read from disk inside a
memory cgroup of L (a fixed number of steps, cold page cache).

The chess case (--cases chess; issue 24) is chess-shaped data of --chess
positions (scripts/chess_data.py: positions i8[12,8,8], moves i32, results
i8), three fields a sample, and a compiled two-head PyTorch model (a small
conv trunk, a policy head of 4672 classes on moves, a tanh value head on
results), in each process:

  chess-reference  the model on GPU-resident tensors (normalised positions,
                   int64 moves, float results; slices)
  chess-dstk       the model fed by dstk.Loader(fields=[positions, moves,
                   results], output="torch")
  chess-loader3    that loader alone (tensors taken, no model)
  chess-loader1    the loader alone on the same data as one field (positions)

and the table gives chess-dstk / chess-reference (target >= 95%) and
chess-loader3 / chess-loader1 (>= 95%). With --device cpu (the default where
PyTorch sees no GPU) the chess case runs on the CPU (eager, no compile) with
NumPy batches: a check of the script itself, not a measurement. --tiny: small
sizes, a quick run.

    python3 scripts/bench-python-loader.py --out "$OUT"   # DSTK_BIN: dsgen's folder
    python3 scripts/bench-python-loader.py --tiny --cases chess --device cpu
"""
import argparse, json, os, resource, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_count(text):
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


def parse_bytes(text):
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


# ---- worker: one process, the three ways --------------------------------------

def worker(a):
    import numpy as np
    import torch
    sys.path.insert(0, HERE)
    from torch_baseline import MemmapSamples, compiled_ref_cnn
    import dstk

    ds = dstk.open(a.dataset)
    xf, yf = ds["train"]["x"], ds["train"]["y"]
    n = xf.samples
    step, mean, std = compiled_ref_cnn(ds)
    out = {"samples": n, "ways": {}}

    def timed(batches, warm):
        """Runs `warm` steps, then timed ones from the iterator: `steps` of
        them where given, for at most max_seconds where given."""
        it = iter(batches)
        for _ in range(warm):
            step(*next(it))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        done = 0
        while (not a.steps or done < a.steps) and not (a.max_seconds and time.perf_counter() - t0 > a.max_seconds):
            step(*next(it))
            done += 1
        torch.cuda.synchronize()
        return done * a.batch / (time.perf_counter() - t0)

    def forever(make):
        while True:
            yield from make()

    for way in a.ways.split(","):
        free0 = torch.cuda.mem_get_info()[0]
        info = {}
        if way == "reference":
            x = torch.from_numpy(np.array(xf.numpy())).cuda().float().sub_(mean).div_(std)
            y = torch.from_numpy(np.array(yf.numpy())).cuda().long()
            k = n // a.batch
            rate = timed(forever(lambda: ((x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch])
                                          for i in range(k))), 30)
            del x, y
        elif way == "dstk":
            loader = dstk.Loader(a.dataset, batch=a.batch, order="chunk", seed=0, placement="stream",
                                 device="cuda:0", readers=a.readers, output="torch")
            info = {"device_bytes": loader.device_bytes, "host_bytes": loader.host_bytes,
                    "gpu_taken": free0 - torch.cuda.mem_get_info()[0]}
            rate = timed(forever(lambda: loader), 30)
            info["times"] = loader.times
            del loader
        elif way == "dlpack":
            loader = dstk.Loader(a.dataset, batch=a.batch, order="chunk", seed=0, placement="stream",
                                 device="cuda:0", readers=a.readers)
            rate = timed(forever(lambda: ((torch.from_dlpack(x), torch.from_dlpack(y).long()) for x, y in loader)),
                         30)
            del loader
        elif way == "loader":
            # The loader alone (torch tensors taken, no training): how
            # fast it delivers, readers and conversion included; an upper
            # bound on what it can feed, not its CPU cost per step.
            loader = dstk.Loader(a.dataset, batch=a.batch, order="chunk", seed=0, placement="stream",
                                 device="cuda:0", readers=a.readers, output="torch")
            it = forever(lambda: loader)
            for _ in range(30):
                next(it)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            done = 0
            while (not a.steps or done < a.steps) and not (a.max_seconds and time.perf_counter() - t0 > a.max_seconds):
                next(it)
                done += 1
            torch.cuda.synchronize()
            rate = done * a.batch / (time.perf_counter() - t0)
            info["us_per_batch"] = 1e6 * a.batch / rate
            del it, loader
        else:
            xpath = os.path.join(a.dataset, ds.manifest["splits"][0]["fields"][0]["file"])
            ypath = os.path.join(a.dataset, ds.manifest["splits"][0]["fields"][1]["file"])
            dl = torch.utils.data.DataLoader(MemmapSamples(xpath, ypath), batch_size=a.batch, shuffle=True,
                                             num_workers=4, pin_memory=True, drop_last=True,
                                             persistent_workers=True)
            rate = timed(forever(lambda: ((((xb.cuda(non_blocking=True).float() - mean) / std),
                                           yb.cuda(non_blocking=True)) for xb, yb in dl)), 30)
            del dl
        info["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        turns = out["ways"].get(way, {}).get("turns", []) + [rate]
        info["turns"], info["samples_per_s"] = turns, statistics.fmean(turns)
        out["ways"][way] = info
        print(f"{way:10s} {rate:12,.0f} samples/s", file=sys.stderr, flush=True)
    print(json.dumps(out))


# ---- worker: the chess case ----------------------------------------------------

CHESS = ["positions", "moves", "results"]


def two_head_step(torch, device, compile_step):
    """A two-head model of chess positions and its SGD step (compiled on the GPU)."""
    nn, F = torch.nn, torch.nn.functional

    class TwoHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Sequential(nn.Conv2d(12, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                       nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.Flatten(),
                                       nn.Linear(64 * 64, 256), nn.ReLU())
            self.policy = nn.Linear(256, 4672)
            self.value = nn.Linear(256, 1)

        def forward(self, x):
            h = self.trunk(x)
            return self.policy(h), torch.tanh(self.value(h)).squeeze(1)

    torch.manual_seed(0)
    model = TwoHead().to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=device == "cuda")

    def step(positions, moves, results):
        opt.zero_grad(set_to_none=True)
        policy, value = model(positions)
        loss = F.cross_entropy(policy, moves) + F.mse_loss(value, results)
        loss.backward()
        opt.step()
        return loss

    return torch.compile(step, mode="reduce-overhead") if compile_step else step


def chess_worker(a):
    import numpy as np
    import torch
    import dstk

    device = a.device
    if device == "cuda":
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step = two_head_step(torch, device, device == "cuda")
    out = {"ways": {}}
    dev = None if device == "cuda" else "cpu"

    def timed(it, train, warm=20):
        """Samples per second over `it`'s batches, for a.max_seconds (or a.steps)."""
        for _ in range(warm):
            b = next(it)
            if train:
                step(*b)
        sync()
        t0, done = time.perf_counter(), 0
        while (not a.steps or done < a.steps) and not (a.max_seconds and time.perf_counter() - t0 > a.max_seconds):
            b = next(it)
            if train:
                step(*b)
            done += 1
        sync()
        return done * a.batch / (time.perf_counter() - t0)

    def loader(fields):
        return dstk.Loader(a.dataset, fields=fields, as_tuple=True, batch=a.batch, order="chunk", seed=0,
                           placement="stream", device=dev, output="torch")

    def forever(l):
        while True:
            yield from l

    for way in a.ways.split(","):
        info = {}
        if way == "chess-reference":
            ds = dstk.open(a.dataset)
            stats = ds.manifest["splits"][0]["fields"][0].get("stats") or ds.manifest["stats"]
            mean = torch.tensor(stats["mean"], device=device).view(1, 12, 1, 1)
            std = torch.tensor(stats["std"], device=device).view(1, 12, 1, 1)
            tr = ds["train"]
            x = torch.from_numpy(np.array(tr["positions"].numpy())).to(device).float().sub_(mean).div_(std)
            y = torch.from_numpy(np.array(tr["moves"].numpy())).to(device).long()
            r = torch.from_numpy(np.array(tr["results"].numpy())).to(device).float()
            k = len(y) // a.batch
            batches = ((x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch],
                        r[i * a.batch:(i + 1) * a.batch]) for _ in iter(int, 1) for i in range(k))
            rate = timed(batches, True)
            del x, y, r
        elif way == "chess-dstk":
            l = loader(CHESS)
            info = {"device_bytes": l.device_bytes, "host_bytes": l.host_bytes, "plan": l.describe()}
            rate = timed(forever(l), True)
        elif way in ("chess-loader3", "chess-loader1"):
            l = loader(CHESS if way == "chess-loader3" else ["positions"])
            rate = timed(forever(l), False)
        else:
            sys.exit(f"unknown way {way}")
        info["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        turns = out["ways"].get(way, {}).get("turns", []) + [rate]
        info["turns"], info["samples_per_s"] = turns, statistics.fmean(turns)
        out["ways"][way] = info
        print(f"{way:16s} {rate:12,.0f} samples/s", file=sys.stderr, flush=True)
    print(json.dumps(out))


# ---- driver ------------------------------------------------------------------

def run_worker(a, dataset, ways, steps, log, prefix=None, max_seconds=0, case="cifar"):
    """One worker process; max_seconds caps each way's timed loop (the slow memmap from disk)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", dataset, "--ways", ways, "--batch", str(a.batch),
           "--steps", str(steps), "--readers", str(a.readers), "--max-seconds", str(max_seconds or a.seconds),
           "--case", case, "--device", a.device]
    if prefix:
        cmd = prefix + cmd
    with open(log, "w") as err:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    if p.returncode != 0:
        sys.exit(f"bench-python-loader: worker failed (rc {p.returncode}); see {log}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def in_ram(a, dsgen):
    data = os.path.join(a.work, "ram")
    subprocess.run([dsgen, data, "--train", str(a.train), "--test", "0", "--force", "-q"], check=True)
    ways = "reference,dstk,dlpack,memmap,loader" + ",reference,dstk" * a.pairs
    results = [run_worker(a, data, ways, 0,
                          os.path.join(a.out, f"run{r}.log")) for r in range(a.runs)]
    json.dump(results, open(os.path.join(a.out, "bench-python-loader.json"), "w"), indent=1)
    rows = {}
    for way in ("reference", "dstk", "dlpack", "memmap", "loader"):
        rates = [r["ways"][way]["samples_per_s"] for r in results]
        rows[way] = (statistics.median(rates), min(rates), max(rates))
    d = results[-1]["ways"]["dstk"]
    lines = [f"in RAM: {a.train:,} samples u8 3x32x32, batch {a.batch}, {a.runs} processes, "
             f"{a.seconds:g} s a turn, {a.pairs + 1} turns of reference and dstk (median [min, max] samples/s)"]
    for way, (med, lo, hi) in rows.items():
        lines.append(f"  {way:10s} {med:12,.0f}  [{lo:,.0f}, {hi:,.0f}]")
    ratios = [r["ways"]["dstk"]["samples_per_s"] / r["ways"]["reference"]["samples_per_s"] for r in results]
    lines.append(f"  dstk / reference {statistics.median(ratios):.1%} (per process: "
                 f"{', '.join(f'{x:.1%}' for x in ratios)})   "
                 f"dstk / memmap {rows['dstk'][0] / rows['memmap'][0]:.2f}x")
    lines.append(f"  the loader alone (no training): one batch every {results[-1]['ways']['loader']['us_per_batch']:.0f} us")
    lines.append(f"  dstk ceilings: GPU {gib(d['device_bytes'])} (taken {gib(d['gpu_taken'])}), "
                 f"host {gib(d['host_bytes'])}; process peak RSS {gib(d['peak_rss'])}")
    return lines


def chess(a, dsconvert):
    sys.path.insert(0, HERE)
    from chess_data import chess_dataset
    data = chess_dataset(dsconvert, os.path.join(a.work, "chess-work"), a.chess)
    ways = "chess-reference,chess-dstk,chess-loader3,chess-loader1" + ",chess-reference,chess-dstk" * a.pairs
    results = [run_worker(a, data, ways, 0, os.path.join(a.out, f"chess{r}.log"), case="chess")
               for r in range(a.runs)]
    json.dump(results, open(os.path.join(a.out, "bench-python-loader-chess.json"), "w"), indent=1)
    lines = [f"chess: {a.chess:,} positions (positions i8[12,8,8], moves i32, results i8), batch {a.batch}, "
             f"{a.device}, {a.runs} processes, {a.seconds:g} s a turn (median [min, max] samples/s)"]
    for way in ("chess-reference", "chess-dstk", "chess-loader3", "chess-loader1"):
        rates = [r["ways"][way]["samples_per_s"] for r in results]
        lines.append(f"  {way:16s} {statistics.median(rates):12,.0f}  [{min(rates):,.0f}, {max(rates):,.0f}]")

    def ratio(x, y):
        per = [r["ways"][x]["samples_per_s"] / r["ways"][y]["samples_per_s"] for r in results]
        return f"{statistics.median(per):.1%} (per process: {', '.join(f'{v:.1%}' for v in per)})"

    lines.append(f"  chess-dstk / chess-reference {ratio('chess-dstk', 'chess-reference')}   target >= 95%")
    lines.append(f"  chess-loader3 / chess-loader1 {ratio('chess-loader3', 'chess-loader1')}   target >= 95%")
    d = results[-1]["ways"]["chess-dstk"]
    lines.append(f"  dstk ceilings: GPU {gib(d['device_bytes'])}, host {gib(d['host_bytes'])}; "
                 f"process peak RSS {gib(d['peak_rss'])}")
    lines += [f"  {line}" for line in d["plan"]]
    return lines


def cgroup(a, dsgen):
    limit = parse_bytes(a.cgroup_limit)
    samples = 4 * limit // (3 * 32 * 32 + 4)
    data = os.path.join(a.work, "disk")
    subprocess.run([dsgen, data, "--train", str(samples), "--test", "0", "--force", "-q"], check=True)
    for f in os.listdir(data):
        subprocess.run(["dd", f"if={os.path.join(data, f)}", "iflag=nocache", "count=0"], stderr=subprocess.DEVNULL)
    group = "/sys/fs/cgroup/dstk-bench-python"
    os.makedirs(group, exist_ok=True)
    open(os.path.join(group, "memory.max"), "w").write(str(limit))
    shell = ["bash", "-c", f'echo $BASHPID > {group}/cgroup.procs && exec "$@"', "bash"]
    r = run_worker(a, data, "dstk,memmap", a.cgroup_steps, os.path.join(a.out, "cgroup.log"), shell, 45)
    d, m = r["ways"]["dstk"], r["ways"]["memmap"]
    return [f"cgroup {gib(limit)}, data {gib(samples * (3 * 32 * 32 + 4))} on disk, up to {a.cgroup_steps} steps "
            f"or 45 s per way, one run:",
            f"  dstk       {d['samples_per_s']:12,.0f}   memmap {m['samples_per_s']:12,.0f}   "
            f"dstk / memmap {d['samples_per_s'] / m['samples_per_s']:.2f}x; dstk host ceiling {gib(d['host_bytes'])}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "build-gpu/bench-python"), help="logs and JSON")
    ap.add_argument("--work", default="/var/tmp/dstk-bench-python",
                    help="dataset folder, on disk (removed at the end)")
    ap.add_argument("--train", type=parse_count, default=parse_count("150K"))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=4, help="timed seconds of each turn of a way (in RAM)")
    ap.add_argument("--pairs", type=int, default=3, help="turns of reference and dstk after the first round (in RAM)")
    ap.add_argument("--cgroup-limit", default="", help="e.g. 4G: add the larger-than-RAM run (root, cgroup v2)")
    ap.add_argument("--cgroup-steps", type=int, default=400)
    ap.add_argument("--cases", default="cifar,chess", help="cifar (u8 images, ref-cnn), chess (three fields, two heads)")
    ap.add_argument("--chess", type=parse_count, default=parse_count("1M"), help="chess positions (chess case)")
    ap.add_argument("--device", default="", help="cuda or cpu (default: cuda where PyTorch sees a GPU)")
    ap.add_argument("--tiny", action="store_true", help="a quick run at small sizes (checks the script)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--ways", default="reference,dstk,memmap", help=argparse.SUPPRESS)
    ap.add_argument("--case", default="cifar", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--max-seconds", type=float, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.device:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.worker:
        a.dataset = a.worker
        return chess_worker(a) if a.case == "chess" else worker(a)
    if a.tiny:
        a.train, a.chess, a.runs, a.seconds, a.pairs = 4096, 8192, 1, 1, 0
    cases = a.cases.split(",")
    if a.device == "cpu" and "cifar" in cases:
        sys.exit("bench-python-loader: the cifar case needs a GPU (its reference is a compiled CUDA step); "
                 "--cases chess runs on the CPU")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)  # dsgen stages its output beside the dataset: the parent must exist
    bindir = os.environ.get("DSTK_BIN", "build-gpu/bin")
    t0 = time.time()
    lines = []
    if "cifar" in cases:
        lines += in_ram(a, os.path.join(bindir, "dsgen"))
    if "chess" in cases:
        lines += chess(a, os.path.join(bindir, "dsconvert"))
    if a.cgroup_limit:
        lines += cgroup(a, os.path.join(bindir, "dsgen"))
    shutil.rmtree(a.work, ignore_errors=True)
    lines.append(f"({time.time() - t0:.0f} s; logs in {a.out})")
    open(os.path.join(a.out, "summary.txt"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
