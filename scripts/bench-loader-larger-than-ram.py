#!/usr/bin/env python3
"""dstk.Loader on chess-shaped data larger than memory (issue 24's seeds case):
--positions chess positions (scripts/chess_data.py: positions i8[12,8,8],
moves i32, results i8; 20M is about 15.5 GB) read from disk inside a memory
cgroup of --limit (default 8G), every file's pages evicted before each run:

  disk      the disk's best random-chunk read rate in the cgroup (dsbench
            io.rand.chunk.direct at 4 and 16 threads over up to 8 GiB, and
            io.rand.chunk.pread.cold at 16 threads over about a run's volume
            of reads, up to the whole file: buffered reads that fit the
            cgroup's page cache would skip the reclaim a run pays), each
            chunk read at most once a pass as an epoch reads it; measured
            right before each loader run, each run compared with its own
            (a cloud disk's rate drifts by tens of percent within minutes)
  dstk      dstk.Loader(fields=[positions, moves, results], placement="stream")
            delivering batches (each field read once where it lands, no model)
            for --seconds: samples/s, bytes/s against the disk's rate, the
            process's peak RSS against the host ceiling the loader printed
  numpy     the same data as a user would write it: np.load(mmap_mode="r") of
            the dataset's .npy files, a Dataset of (positions[i], moves[i],
            results[i]) and DataLoader(shuffle=True, 4 workers), for --seconds
            (needs PyTorch; skipped, saying so, without it)

Root and a memory cgroup controller (v2, or v1 at /sys/fs/cgroup/memory).
DSTK_BIN names the tools' folder (default build-gpu/bin). --tiny runs a small
case (a check of the script: any machine, no GPU needed) with the loader on the
CPU: a worker holding a CUDA context and PyTorch's CUDA libraries needs more
memory than its 160M cgroup, which then reclaims the libraries' pages as the
worker runs, and the run crawls for minutes.

    sudo python3 scripts/bench-loader-larger-than-ram.py --out "$OUT"
    sudo python3 scripts/bench-loader-larger-than-ram.py --tiny
"""
import argparse, json, os, resource, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ["positions", "moves", "results"]


def parse_size(text, powers=1024):
    mult = {"K": powers, "M": powers**2, "G": powers**3, "T": powers**4}
    return int(float(text[:-1]) * mult[text[-1].upper()]) if text[-1].upper() in mult else int(text)


# ---- workers (run inside the cgroup) -----------------------------------------

def touch(batch, acc):
    """Reads every value of a batch once where it is (GPU tensors or NumPy),
    adding the sums into acc[0] without waiting for them: a float() of a GPU
    sum per field would synchronise with the GPU three times a batch, which is
    the benchmark's cost, not the loader's."""
    for v in batch.values():
        s = v.sum()
        acc[0] = s if acc[0] is None else acc[0] + s


def dummy_batch(loader, batch, torch):
    """Zeros shaped and typed as the loader's batches, from its description
    alone (the loader has read nothing yet)."""
    import numpy as np
    names = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32,
             "i16": np.int16, "i8": np.int8, "u8": np.uint8, "u16": np.uint16}
    out = {}
    for name, f in loader.fields.items():
        z = np.zeros((batch,) + tuple(f["shape"]), dtype=names[f["dtype"]])
        out[name] = torch.from_numpy(z).cuda() if torch else z
    return out


def rss_verdict(growth, anon, ceiling):
    if growth <= ceiling:
        return "within"
    if anon <= ceiling:
        return (f"within in anonymous memory; the total is {mib(growth - ceiling)} over in file-backed or "
                "shared pages (such as the library's code as the loop first runs it), which the loader does not "
                "allocate")
    return "OVER"


def proc_status_bytes(key):
    """VmRSS, VmHWM or RssAnon of this process in bytes. VmHWM, not ru_maxrss: ru_maxrss
    survives fork and exec, so a worker would report the driver's peak (the
    driver maps the data files while it writes them)."""
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def loader_worker(a):
    import dstk
    torch, gpu = None, False
    if not a.cpu:
        try:
            import torch
            gpu = torch.cuda.is_available()
            if gpu:
                torch.zeros(1, device="cuda")  # the CUDA context, before the baseline below
        except ImportError:
            torch = None
    fields = a.fields.split(",")
    extra = json.loads(a.loader_args)
    if a.readers:
        extra["readers"] = a.readers
    if a.cpu:
        extra.setdefault("device", "cpu")
    loader = dstk.Loader(a.dataset, fields=fields, batch=a.batch, order="chunk", seed=0, placement="stream",
                         output="torch" if gpu else "arrays", **extra)
    # The consumer's own memory before the loader's: touch() on a batch of the
    # loader's dtypes and shapes loads PyTorch's kernels for them (host memory
    # that any loop over these tensors takes), then the loader starts.
    touch(dummy_batch(loader, a.batch, torch if gpu else None), [None])
    if gpu:
        torch.cuda.synchronize()
    rss_before = proc_status_bytes("VmRSS")  # the interpreter, PyTorch, the CUDA context, the consumer
    # Anonymous memory too, sampled as the loop runs: what the loader
    # allocates. The total's peak also holds file-backed pages, such as the
    # library's code mapped as the loop first runs it.
    anon_before = peak_anon = proc_status_bytes("RssAnon")
    t0, samples, acc, n = time.perf_counter(), 0, [None], 0
    for b in loader:
        touch(b, acc)
        samples += len(b[fields[0]])
        n += 1
        if n % 16 == 0:
            peak_anon = max(peak_anon, proc_status_bytes("RssAnon"))
        if time.perf_counter() - t0 > a.seconds:
            break
    peak_anon = max(peak_anon, proc_status_bytes("RssAnon"))
    if gpu:
        torch.cuda.synchronize()
    s = time.perf_counter() - t0
    print(json.dumps({"samples_per_s": samples / s, "samples": samples, "seconds": s,
                      "read_wait": loader.times.get("read_wait", 0.0),
                      "host_ceiling": loader.host_bytes, "device": loader.device, "plan": loader.describe(),
                      "rss_before": rss_before, "peak_rss": proc_status_bytes("VmHWM"),
                      "anon_growth": peak_anon - anon_before}))


class MemmapChess:
    """What a user writes: the dataset's .npy files opened with np.load(mmap_mode='r') in each worker."""

    def __init__(self, paths):
        import numpy as np
        self.paths, self.arrays = paths, None
        self.n = np.load(paths[1], mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np
        if self.arrays is None:
            self.arrays = [np.load(p, mmap_mode="r") for p in self.paths]
        p, m, r = self.arrays
        return np.array(p[i]), int(m[i]), int(r[i])


def numpy_worker(a):
    import torch
    meta = json.load(open(os.path.join(a.dataset, "dataset.json")))
    train = next(s for s in meta["splits"] if s["name"] == "train")
    files = {f["name"]: os.path.join(a.dataset, f["file"]) for f in train["fields"]}
    dl = torch.utils.data.DataLoader(MemmapChess([files[f] for f in FIELDS]), batch_size=a.batch, shuffle=True,
                                     num_workers=4, pin_memory=torch.cuda.is_available(), drop_last=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0, samples, acc = time.perf_counter(), 0, [None]
    for p, m, r in dl:
        touch({"p": p.to(dev).float(), "m": m.to(dev), "r": r.to(dev).float()}, acc)
        samples += len(m)
        if time.perf_counter() - t0 > a.seconds:
            break
    s = time.perf_counter() - t0
    print(json.dumps({"samples_per_s": samples / s, "samples": samples, "seconds": s,
                      "peak_rss": proc_status_bytes("VmHWM"),
                      "children_peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))


# ---- driver --------------------------------------------------------------------

class Cgroup:
    def __init__(self, limit):
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and \
                "memory" in open("/sys/fs/cgroup/cgroup.controllers").read():
            self.dir, self.v2 = f"/sys/fs/cgroup/dstk-ltr-chess-{os.getpid()}", True
            open("/sys/fs/cgroup/cgroup.subtree_control", "w").write("+memory")
            os.makedirs(self.dir)
            open(os.path.join(self.dir, "memory.max"), "w").write(str(limit))
        elif os.path.isdir("/sys/fs/cgroup/memory"):
            self.dir, self.v2 = f"/sys/fs/cgroup/memory/dstk-ltr-chess-{os.getpid()}", False
            os.makedirs(self.dir)
            open(os.path.join(self.dir, "memory.limit_in_bytes"), "w").write(str(limit))
        else:
            sys.exit("bench-loader-larger-than-ram: no memory cgroup controller (needs root, cgroup v2 or v1)")

    def run(self, cmd, log):
        shell = ["bash", "-c", f'echo $BASHPID > {self.dir}/cgroup.procs && exec "$@"', "bash"]
        with open(log, "a") as err:
            return subprocess.run(shell + cmd, stdout=subprocess.PIPE, stderr=err, text=True)

    def remove(self):
        os.rmdir(self.dir)


def evict(folder):
    subprocess.run(["sync"])
    for f in os.listdir(folder):
        subprocess.run(["dd", f"if={os.path.join(folder, f)}", "iflag=nocache", "count=0"], stderr=subprocess.DEVNULL)
    open("/proc/sys/vm/drop_caches", "w").write("1")


def disk_rates(cg, bindir, ds, out, size, tag):
    """Per method, dsbench's random 4 MiB chunk reads and the thread count of
    the better of its settings: O_DIRECT (as the loader reads) at 4 and 16
    threads over up to 8 GiB (no page cache: a pass past the disk's burst is
    enough), buffered reads from a cold page cache at 16 threads over `size`
    bytes (a run's worth, past what the cgroup's page cache holds: a pass that
    fits skips the reclaim that a run's buffered reads pay)."""
    rates = {}
    for method, case, threads, nbytes in (("direct", "io.rand.chunk.direct", "4,16", min(size, 8 << 30)),
                                          ("pread", "io.rand.chunk.pread.cold", "16", size)):
        res = os.path.join(out, f"disk-{tag}-{method}.json")
        p = cg.run([os.path.join(bindir, "dsbench"), "all", ds, "--cases", case, "--threads", threads,
                    "--size", str(nbytes), "--chunk-size", "4M", "--repetitions", "1", "--min-time", "0",
                    "--json", res, "-f", "-q"], os.path.join(out, "runs.log"))
        if p.returncode != 0:
            sys.exit(f"bench-loader-larger-than-ram: dsbench failed; see {out}/runs.log")
        for r in json.load(open(res))["results"]:
            if r["status"] == "ok" and r["metrics"]["rate"]["median"] > rates.get(method, (0, 0))[0]:
                rates[method] = (r["metrics"]["rate"]["median"], r["params"]["threads"])
    return rates


def worker_run(cg, a, way, ds, readers=0):
    p = cg.run([sys.executable, os.path.abspath(__file__), "--worker", way, "--dataset", ds, "--batch", str(a.batch),
                "--readers", str(readers), "--fields", a.fields, "--loader-args", a.loader_args,
                "--seconds", str(a.seconds)] + (["--cpu"] if a.tiny else []), os.path.join(a.out, "runs.log"))
    if p.returncode != 0:
        sys.exit(f"bench-loader-larger-than-ram: the {way} run failed (rc {p.returncode}); see {a.out}/runs.log")
    return json.loads(p.stdout.strip().splitlines()[-1])


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", default="20M", help="chess positions (K M G: powers of 1000)")
    ap.add_argument("--limit", default="8G", help="the memory cgroup's limit")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--readers", default="0",
                    help="the loader's reader threads, comma-separated for several settings (0: its plan's)")
    ap.add_argument("--fields", default=",".join(FIELDS),
                    help="the fields dstk.Loader delivers, comma-separated (the bytes/s count these alone)")
    ap.add_argument("--runs", type=int, default=3, help="fresh dstk.Loader processes per readers setting")
    ap.add_argument("--seconds", type=float, default=60, help="timed seconds of each run")
    ap.add_argument("--work", default="/var/tmp/dstk-ltr-chess", help="data folder, on disk")
    ap.add_argument("--out", default=os.environ.get("OUT", "build-gpu/ltr-chess"), help="logs and JSON")
    ap.add_argument("--loader-args", default="{}",
                    help='more dstk.Loader arguments as JSON, e.g. \'{"direct": false, "window": 16}\'')
    ap.add_argument("--no-numpy", action="store_true", help="skip the np.load(mmap) + DataLoader run")
    ap.add_argument("--keep-data", action="store_true", help="keep the dataset for another run")
    ap.add_argument("--tiny", action="store_true",
                    help="a small case: 500K positions, 160M, 5 s a run, the loader on the CPU, no numpy run")
    ap.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)  # a worker without CUDA
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--dataset", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.readers = int(a.readers)
        return loader_worker(a) if a.worker == "dstk" else numpy_worker(a)
    if a.tiny:
        a.positions, a.limit, a.seconds = "500K", "160M", 5
    if os.geteuid() != 0:
        sys.exit("bench-loader-larger-than-ram: needs root (memory cgroups, dropping the page cache)")
    n, limit = parse_size(a.positions, 1000), parse_size(a.limit)
    bindir = os.environ.get("DSTK_BIN", "build-gpu/bin")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    sys.path.insert(0, HERE)
    from chess_data import ROW_BYTES, chess_dataset
    t0 = time.time()
    ds = os.path.join(a.work, "chess")
    if not os.path.exists(os.path.join(ds, "dataset.json")):
        ds = chess_dataset(os.path.join(bindir, "dsconvert"), a.work, n)
    cg = Cgroup(limit)
    try:
        disk_bytes = min(n * 768, int(a.seconds * 2.5e9))
        dstk_runs = {}
        for readers in [int(r) for r in a.readers.split(",")]:
            for i in range(a.runs):
                evict(ds)
                disk = disk_rates(cg, bindir, ds, a.out, disk_bytes, f"{readers}-{i}")
                evict(ds)
                run = worker_run(cg, a, "dstk", ds, readers)
                run["disk"] = disk
                dstk_runs.setdefault(readers, []).append(run)
        m = None
        try:
            import torch  # noqa: F401
            if not (a.no_numpy or a.tiny):
                evict(ds)
                m = worker_run(cg, a, "numpy", ds)
        except ImportError:
            pass
    finally:
        cg.remove()
    field_bytes = {"positions": 768, "moves": 4, "results": 1}
    row = sum(field_bytes[f] for f in a.fields.split(","))
    d_all = next(iter(dstk_runs.values()))
    d = d_all[0]
    lines = [f"chess, {n:,} positions ({gib(n * ROW_BYTES)}) on disk, memory cgroup {gib(limit)}, batch {a.batch}, "
             f"{a.seconds:g} s a run, device {d['device']}, {a.runs} fresh processes per row (median [min-max])",
             f"  disk, random 4 MiB chunks, {gib(disk_bytes)} of reads a buffered pass, right before each run, O_DIRECT "
             "best of 4/16 threads, buffered 16 threads (GB/s): " + "; ".join(
                 ", ".join(f"{m} {r / 1e9:.3f} ({t})" for m, (r, t) in sorted(run["disk"].items()))
                 for runs in dstk_runs.values() for run in runs)]
    for readers, runs in dstk_runs.items():
        rates = sorted(r["samples_per_s"] for r in runs)
        med = statistics.median(rates)
        growth = max(r["peak_rss"] - r["rss_before"] for r in runs)
        anon = max(r["anon_growth"] for r in runs)
        wait = statistics.median(r["read_wait"] / r["seconds"] for r in runs)
        # Each run against the disk measured just before it (a cloud disk's
        # rate drifts by tens of percent within minutes): the ratios' spread.
        best = sorted(r["samples_per_s"] * row / max(v for v, _ in r["disk"].values()) for r in runs)
        direct = sorted(r["samples_per_s"] * row / r["disk"]["direct"][0] for r in runs if "direct" in r["disk"])
        lines.append(f"  dstk.Loader fields {a.fields} readers {readers or 'planned'}: {med:12,.0f} samples/s "
                     f"[{rates[0]:,.0f}-{rates[-1]:,.0f}]  {med * row / 1e9:.3f} GB/s = "
                     f"{statistics.median(best):.1%} [{best[0]:.1%}-{best[-1]:.1%}] of the disk's best rate before it" +
                     (f" ({statistics.median(direct):.1%} [{direct[0]:.1%}-{direct[-1]:.1%}] of its O_DIRECT rate)"
                      if direct else "") +
                     f", waiting for data {wait:.0%} of the time; "
                     f"largest RSS growth {mib(growth)} (anonymous {mib(anon)}) over {gib(runs[0]['rss_before'])} "
                     f"before the loader (Python, PyTorch, CUDA, the loop's kernels) against the loader's host ceiling "
                     f"{mib(runs[0]['host_ceiling'])}: " + rss_verdict(growth, anon, runs[0]["host_ceiling"]))
        lines += [f"    {line}" for line in runs[0]["plan"]]
    if m:
        lines.append(f"  np.load(mmap) + DataLoader {m['samples_per_s']:12,.0f} samples/s; peak RSS "
                     f"{gib(m['peak_rss'])} (workers {gib(m['children_peak_rss'])}); dstk / numpy "
                     f"{statistics.median(r['samples_per_s'] for r in d_all) / m['samples_per_s']:.2f}x")
    else:
        why = "--no-numpy" if a.no_numpy else "--tiny: PyTorch outgrows its cgroup" if a.tiny else "PyTorch is not installed"
        lines.append("  np.load(mmap) + DataLoader: skipped (" + why + ")")
    if not a.keep_data:
        shutil.rmtree(a.work, ignore_errors=True)
    lines.append(f"({time.time() - t0:.0f} s; logs in {a.out})")
    open(os.path.join(a.out, "summary.txt"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
