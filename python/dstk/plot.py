"""Pictures of a dstk run, drawn with matplotlib.

    python -m dstk.plot train.jsonl -o curves.png    # dstrain --log-json: curves and where the time went
    python -m dstk.plot bench.json -o bench.png      # dsbench --json: rates against the disk's and PCIe's
    python -m dstk.plot a.json b.json -o cmp.png     # several dsbench results side by side

The kind of each input is read from its content (JSON lines with "event", or
a dsbench results document). ``-o -`` writes the PNG to stdout (``dsbench
compare --plot`` does). An existing output is replaced only with --force,
and never through a link; the picture is written to a temporary name and
renamed into place. This file needs only the standard library and
matplotlib, so it also runs as a plain script (python3 plot.py ...) where the
dstk package is not installed.

Exit codes: 0 written, 1 an input that cannot be read or holds nothing to
draw, 2 usage (bad arguments, an existing output without --force), 3
matplotlib missing.
"""
import argparse
import json
import os
import sys
import tempfile

__all__ = ["bench_figure", "load_bench", "load_train", "main", "train_figure"]

STAGE_COLOURS = {"compute": "#4878d0", "waiting for data": "#ee854a", "other": "#bbbbbb"}
FAMILY_COLOURS = {"io": "#4878d0", "decode": "#6acc64", "h2d": "#d65f5f", "loader": "#956cb4"}
# PCIe's payload rate per lane in GB/s, by generation (after line encoding).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


class PlotError(Exception):
    """An input or output problem, with the exit code it maps to."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


# ---- inputs


def load_train(path):
    """dstrain --log-json lines: {"epochs": [...], "evals": [...], "memory": {...} or None}."""
    epochs, evals, memory = [], [], None
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise PlotError(f"{path}: line {n} is not JSON ({e}); is it dstrain --log-json output?")
                kind = rec.get("event") if isinstance(rec, dict) else None
                if kind == "epoch":
                    epochs.append(rec)
                elif kind == "eval":
                    evals.append(rec)
                elif kind == "memory":
                    memory = rec
    except OSError as e:
        raise PlotError(f"cannot read {path} ({e.strerror})")
    if not epochs:
        raise PlotError(f"{path}: no epoch lines (the run stopped before its first epoch ended?); nothing to draw")
    return {"epochs": epochs, "evals": evals, "memory": memory}


def load_bench(path):
    """A dsbench results document (dsbench all --json)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise PlotError(f"cannot read {path} ({e.strerror})")
    except ValueError as e:
        raise PlotError(f"{path}: not JSON ({e})")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise PlotError(f"{path}: not a dsbench results file (no \"results\" list); write one with dsbench all --json")
    return doc


def input_kind(path):
    """'train' for JSON lines with events, 'bench' for a dsbench document."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(4096)
    except OSError as e:
        raise PlotError(f"cannot read {path} ({e.strerror})")
    first = head.lstrip().split("\n", 1)[0]
    try:
        rec = json.loads(first)
        if isinstance(rec, dict) and "event" in rec:
            return "train"
    except ValueError:
        pass
    if head.lstrip().startswith("{") and ('"results"' in head or '"schema_version"' in head):
        return "bench"
    raise PlotError(f"{path}: neither dstrain --log-json lines nor dsbench --json results; nothing to draw", 2)


# ---- figures


def _figure(width, height):
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotError(f"matplotlib is missing ({e}); install it (pip install matplotlib, or apt-get install "
                        "python3-matplotlib)", 3)
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _time_parts(e):
    """An epoch's wall time split into compute, waiting for data, and the rest."""
    st = e.get("stages", {})
    compute = float(st.get("compute_s", 0.0))
    wait = float(st.get("read_wait_s", 0.0))
    other = max(0.0, float(e.get("seconds", 0.0)) - compute - wait)
    return {"compute": compute, "waiting for data": wait, "other": other}


def train_figure(run, title=None):
    """Loss, accuracy, samples/s and the time per epoch of one dstrain run."""
    epochs = run["epochs"]
    x = [e["epoch"] for e in epochs]
    fig = _figure(11, 7.5)
    (ax_loss, ax_acc), (ax_speed, ax_time) = fig.subplots(2, 2)
    fig.suptitle(title or "dstrain: %d epochs" % len(epochs))

    # Evaluations (--eval-every) sit at their step, as a fraction of epochs.
    steps_per_epoch = epochs[0]["steps"] / epochs[0]["epoch"] if epochs[0].get("steps") else 0
    ev_x = [v["step"] / steps_per_epoch for v in run["evals"]] if steps_per_epoch else []
    has_test = any(e.get("test_loss") or e.get("test_accuracy") for e in epochs)

    ax_loss.plot(x, [e["train_loss"] for e in epochs], "o-", label="train")
    if has_test:
        ax_loss.plot(x, [e["test_loss"] for e in epochs], "s-", label="test")
    if ev_x:
        ax_loss.plot(ev_x, [v["test_loss"] for v in run["evals"]], ".", label="test (--eval-every)")
    ax_loss.set(title="loss", xlabel="epoch")
    ax_loss.legend()

    ax_acc.plot(x, [100 * e["train_accuracy"] for e in epochs], "o-", label="train")
    if has_test:
        ax_acc.plot(x, [100 * e["test_accuracy"] for e in epochs], "s-", label="test")
    if ev_x:
        ax_acc.plot(ev_x, [100 * v["test_accuracy"] for v in run["evals"]], ".", label="test (--eval-every)")
    ax_acc.set(title="accuracy (%)", xlabel="epoch")
    ax_acc.legend()

    ax_speed.bar(x, [e["samples_per_second"] for e in epochs], color="#6acc64")
    ax_speed.set(title="training speed (samples/s)", xlabel="epoch")

    bottom = [0.0] * len(epochs)
    parts = [_time_parts(e) for e in epochs]
    for name, colour in STAGE_COLOURS.items():
        h = [p[name] for p in parts]
        ax_time.bar(x, h, bottom=bottom, color=colour, label=name)
        bottom = [b + v for b, v in zip(bottom, h)]
    for xi, e, top in zip(x, epochs, bottom):
        limited = e.get("stages", {}).get("limited_by")
        if limited:
            ax_time.annotate("limited by\n" + limited, (xi, top), ha="center", va="bottom", fontsize=7)
    ax_time.set(title="where the time went (s per epoch)", xlabel="epoch", ylabel="seconds")
    ax_time.set_ylim(0, max(bottom) * 1.5 or 1)
    ax_time.legend(loc="upper center", ncols=3, fontsize=8)
    for ax in (ax_loss, ax_acc, ax_speed, ax_time):
        ax.set_xticks(x)
    return fig


def _best_rates(doc):
    """Per case the best rate (B/s) over its variants: [(label, B/s)] in the file's order."""
    best = {}
    for r in doc["results"]:
        rate = r.get("metrics", {}).get("rate")
        if r.get("status") != "ok" or not rate or rate.get("unit") != "B/s":
            continue
        key = r.get("case", "?")
        if key not in best or rate["median"] > best[key][1]:
            best[key] = (r.get("variant", ""), rate["median"])
    return {k: v for k, v in best.items()}


def reference_rates(doc):
    """The disk's and PCIe's figures a bench is read against: [(label, B/s)]."""
    refs = []
    rates = {r.get("case"): r for r in doc["results"] if r.get("status") == "ok"}
    for key in ("io.seq.pread.cold", "io.seq.direct"):
        if key in rates and "rate" in rates[key].get("metrics", {}):
            refs.append(("disk, sequential cold read (%s)" % key, rates[key]["metrics"]["rate"]["median"]))
            break
    pinned = [r for r in doc["results"] if r.get("case") == "h2d.pinned" and r.get("status") == "ok"]
    if pinned:
        largest = max(pinned, key=lambda r: r.get("params", {}).get("transfer_bytes", 0))
        refs.append(("PCIe host-to-device, pinned (h2d.pinned)", largest["metrics"]["rate"]["median"]))
    gpu = doc.get("context", {}).get("gpu") or {}
    gen, width = gpu.get("pcie_generation", 0), gpu.get("pcie_width", 0)
    if gen in PCIE_LANE_GBPS and width:
        refs.append(("PCIe Gen%d x%d link" % (gen, width), PCIE_LANE_GBPS[gen] * width * 1e9))
    return refs


def bench_figure(docs, names, title=None):
    """dsbench rates as horizontal bars (GB/s, log scale), one colour per results file, with the
    disk's and PCIe's figures as vertical lines."""
    per_file = [_best_rates(d) for d in docs]
    cases = []
    for rates in per_file:
        cases += [c for c in rates if c not in cases]
    if not cases:
        raise PlotError("%s: no case measured a rate (all waived or failed?); nothing to draw" % ", ".join(names))
    fig = _figure(11, max(4.0, 0.28 * len(cases) * len(docs) + 2))
    ax = fig.subplots()
    height = 0.8 / len(docs)
    for i, (rates, name) in enumerate(zip(per_file, names)):
        ys = [n + i * height for n, c in enumerate(cases) if c in rates]
        ws = [rates[c][1] / 1e9 for c in cases if c in rates]
        # One file: a colour per family of cases (io, decode, h2d, loader); several: one per file.
        colours = ([FAMILY_COLOURS.get(c.split(".")[0], "C7") for c in cases if c in rates] if len(docs) == 1
                   else "C%d" % i)
        ax.barh(ys, ws, height=height, color=colours, label=name if len(docs) > 1 else None)
    ax.set_yticks([n + 0.4 - height / 2 for n in range(len(cases))])
    ax.set_yticklabels([c + ("  (%s)" % per_file[0][c][0] if c in per_file[0] and per_file[0][c][0] else "")
                        for c in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("GB/s (best over each case's settings; log scale)")
    styles = ["--", ":", "-.", (0, (5, 1))]
    for i, (doc, name) in enumerate(zip(docs, names)):
        for j, (label, rate) in enumerate(reference_rates(doc)):
            ax.axvline(rate / 1e9, color="C%d" % (3 + j), linestyle=styles[i % len(styles)],
                       label="%s: %.2f GB/s%s" % (label, rate / 1e9, " (%s)" % name if len(docs) > 1 else ""))
    handles, _ = ax.get_legend_handles_labels()
    if len(docs) == 1:  # the colours' families
        from matplotlib.patches import Patch

        families = {c.split(".")[0] for c in cases}
        handles += [Patch(color=colour, label=name) for name, colour in FAMILY_COLOURS.items() if name in families]
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    host = docs[0].get("context", {}).get("host", "")
    ax.set_title(title or "dsbench: %s%s" % (", ".join(names), " on " + host if host and len(docs) == 1 else ""))
    return fig


# ---- output


def save(fig, out, force):
    """PNG to `out` ('-': stdout), atomically and without replacing unless `force`."""
    if out == "-":
        fig.savefig(sys.stdout.buffer, format="png")
        sys.stdout.buffer.flush()
        return
    out = os.path.abspath(out)
    if os.path.islink(out):
        raise PlotError(f"{out} is a symbolic link (never written through); give another name", 2)
    if os.path.exists(out) and not force:
        raise PlotError(f"{out} exists; give --force to replace it", 2)
    if os.path.exists(out) and not os.path.isfile(out):
        raise PlotError(f"{out} exists and is not a regular file; give another name", 2)
    directory = os.path.dirname(out)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(out) + ".", suffix=".tmp", dir=directory)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 is for the temporary, not the picture
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)  # fails where a file of that name appeared meanwhile
            except FileExistsError:
                raise PlotError(f"{out} exists; give --force to replace it", 2)
            os.unlink(tmp)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dstk.plot",
                                description="Draw a dstrain --log-json file (curves, where the time went) or "
                                "dsbench --json results (rates against the disk's and PCIe's) as a PNG.")
    p.add_argument("inputs", nargs="+", metavar="FILE",
                   help="train.jsonl (dstrain --log-json), or one or more bench.json (dsbench all --json)")
    p.add_argument("-o", "--output", help="PNG to write ('-': stdout; default: the first input with .png)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing output")
    p.add_argument("--title", help="the picture's title")
    a = p.parse_args(argv)
    try:
        kinds = [input_kind(f) for f in a.inputs]
        if kinds[0] == "train":
            if len(a.inputs) > 1:
                raise PlotError("one dstrain log at a time (several inputs are for dsbench results)", 2)
            fig = train_figure(load_train(a.inputs[0]), a.title)
        else:
            if "train" in kinds:
                raise PlotError("a dstrain log among dsbench results; draw them separately", 2)
            fig = bench_figure([load_bench(f) for f in a.inputs], [os.path.basename(f) for f in a.inputs], a.title)
        out = a.output or os.path.splitext(a.inputs[0])[0] + ".png"
        save(fig, out, a.force)
    except PlotError as e:
        print("dstk.plot: error: %s" % e, file=sys.stderr)
        return e.code
    if out != "-":
        print("dstk.plot: wrote %s" % out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
