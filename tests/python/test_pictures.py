"""What a run leaves to look at, read back by other programs: dstrain's
TensorBoard event file through the tensorboard package (PyPI), and the
pictures of python/dstk/plot.py through matplotlib's own objects (the series
drawn are the log's values) and the PNG's header (its size)."""
import importlib.util
import json
import os
import struct

import pytest

from model_support import ROOT, make_dataset, run

tensorboard = pytest.importorskip("tensorboard", reason="the tensorboard package (scripts/setup.sh --test)")
pytest.importorskip("matplotlib", reason="matplotlib (scripts/setup.sh --test)")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def load_plot():
    """python/dstk/plot.py by its path: it needs only matplotlib, not the built package."""
    spec = importlib.util.spec_from_file_location("dstk_plot", ROOT / "python" / "dstk" / "plot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plot = load_plot()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 3-epoch CPU run with --log-json and --tensorboard (and --eval-every)."""
    tmp = tmp_path_factory.mktemp("pictures")
    data = make_dataset(tmp / "data", shape="1x8x8", train=768, test=200)
    run("dstrain", data, "--model", "mlp:16", "--device", "cpu", "-T", 2, "--epochs", 3, "--batch", 64,
        "--log-json", tmp / "train.jsonl", "--tensorboard", tmp / "tb", "--save", tmp / "m.safetensors", "-q")
    lines = [json.loads(x) for x in (tmp / "train.jsonl").read_text().splitlines()]
    return tmp, [x for x in lines if x["event"] == "epoch"]


def png_size(path):
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", raw[16:24])


def scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_reads_the_event_file(trained):
    tmp, epochs = trained
    files = list((tmp / "tb").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")
    acc = EventAccumulator(str(tmp / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for t in ("loss/train", "accuracy/train", "optimizer/lr", "speed/samples_per_s", "memory/host_rss_MiB",
              "loss/train_epoch", "accuracy/train_epoch", "loss/test", "accuracy/test", "time/compute_s",
              "time/read_wait_s", "speed/samples_per_s_epoch", "memory/host_ceiling_MiB", "progress/epoch"):
        assert t in tags, t
    # Epoch points: at each epoch's last global step, the values of --log-json (as float32).
    want_steps = [e["steps"] for e in epochs]
    for tag, key in (("loss/train_epoch", "train_loss"), ("accuracy/test", "test_accuracy"),
                     ("time/compute_s", None)):
        got = scalars(acc, tag)
        assert [s for s, _ in got] == want_steps, tag
        for (_, v), e in zip(got, epochs):
            want = e[key] if key else e["stages"]["compute_s"]
            assert v == pytest.approx(want, rel=1e-6, abs=1e-7), tag
    # Step points: increasing steps within the run, at least one per epoch,
    # the last of each epoch at its last step.
    steps = [s for s, _ in scalars(acc, "loss/train")]
    assert steps == sorted(steps) and steps[-1] == want_steps[-1]
    assert set(want_steps) <= set(steps)
    assert all(0 < v < 10 for _, v in scalars(acc, "loss/train"))


def test_a_second_run_gets_its_own_file(trained, tmp_path):
    tmp, _ = trained
    for _ in range(2):
        run("dstrain", tmp / "data", "--model", "mlp:8", "--device", "cpu", "--epochs", 1, "--batch", 128,
            "--tensorboard", tmp_path / "tb", "--save", tmp_path / "m.safetensors", "--force", "-q")
    assert len(list((tmp_path / "tb").iterdir())) == 2


def test_curves_are_drawn_from_the_log(trained):
    tmp, epochs = trained
    fig = plot.train_figure(plot.load_train(tmp / "train.jsonl"))
    ax_loss, ax_acc, ax_speed, ax_time = fig.axes
    train_line, test_line = ax_loss.lines[:2]
    assert list(train_line.get_xdata()) == [e["epoch"] for e in epochs]
    assert list(train_line.get_ydata()) == pytest.approx([e["train_loss"] for e in epochs])
    assert list(test_line.get_ydata()) == pytest.approx([e["test_loss"] for e in epochs])
    assert list(ax_acc.lines[1].get_ydata()) == pytest.approx([100 * e["test_accuracy"] for e in epochs])
    assert [b.get_height() for b in ax_speed.patches] == pytest.approx([e["samples_per_second"] for e in epochs])
    # Where the time went: compute, waiting for data, the rest, stacked to the epoch's seconds.
    compute, wait, other = ax_time.containers
    assert [b.get_height() for b in compute] == pytest.approx([e["stages"]["compute_s"] for e in epochs])
    assert [b.get_height() for b in wait] == pytest.approx([e["stages"]["read_wait_s"] for e in epochs])
    for c, w, o, e in zip(compute, wait, other, epochs):
        assert c.get_height() + w.get_height() + o.get_height() == pytest.approx(max(e["seconds"], c.get_height() +
                                                                                     w.get_height()))
    out = tmp / "curves.png"
    assert plot.main([str(tmp / "train.jsonl"), "-o", str(out)]) == 0
    assert png_size(out) == (1100, 750)
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # as any output, not the temporary's 0600
    assert plot.main([str(tmp / "train.jsonl"), "-o", str(out)]) == 2  # exists: --force replaces it
    assert plot.main([str(tmp / "train.jsonl"), "-o", str(out), "--force"]) == 0


def bench_doc(rates, pinned=None, pcie=None):
    results = [{"case": k, "variant": v, "status": "ok", "metrics": {"rate": {"unit": "B/s", "median": r}}}
               for k, v, r in rates]
    results.append({"case": "h2d.pageable", "variant": "", "status": "waived", "metrics": {}})
    if pinned:
        results += [{"case": "h2d.pinned", "variant": "size=%d" % b, "status": "ok", "params": {"transfer_bytes": b},
                     "metrics": {"rate": {"unit": "B/s", "median": r}}} for b, r in pinned]
    return {"schema_version": 1, "context": {"host": "h", "gpu": pcie}, "results": results}


def test_bench_bars_and_the_disk_and_pcie_lines(tmp_path):
    doc = bench_doc([("io.seq.pread.cold", "", 2.0e9), ("io.rand.chunk.pread.cold", "threads=1", 1.0e9),
                     ("io.rand.chunk.pread.cold", "threads=4", 3.0e9)],
                    pinned=[(65536, 5e9), (268435456, 25e9)], pcie={"pcie_generation": 4, "pcie_width": 16})
    fig = plot.bench_figure([doc], ["bench.json"])
    ax = fig.axes[0]
    # One bar per case: the best of its settings, in GB/s; h2d.pinned's largest transfer.
    assert [b.get_width() for b in ax.patches] == pytest.approx([2.0, 3.0, 25.0])
    lines = {ln.get_label().split(":")[0]: ln.get_xdata()[0] for ln in ax.lines}
    assert lines["disk, sequential cold read (io.seq.pread.cold)"] == pytest.approx(2.0)
    assert lines["PCIe host-to-device, pinned (h2d.pinned)"] == pytest.approx(25.0)
    assert lines["PCIe Gen4 x16 link"] == pytest.approx(1.969 * 16)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc))
    b.write_text(json.dumps(bench_doc([("io.seq.pread.cold", "", 4.0e9)])))
    two = plot.bench_figure([plot.load_bench(a), plot.load_bench(b)], ["a.json", "b.json"])
    assert sorted(bar.get_width() for bar in two.axes[0].patches) == pytest.approx([2.0, 3.0, 4.0, 25.0])
    assert plot.main([str(a), str(b), "-o", str(tmp_path / "cmp.png")]) == 0
    w, h = png_size(tmp_path / "cmp.png")
    assert w == 1100 and h >= 400


def test_inputs_that_are_not_dstk_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}\n')
    assert plot.main([str(bad), "-o", str(tmp_path / "x.png")]) == 2
    empty = tmp_path / "t.jsonl"
    empty.write_text('{"event": "memory", "memory_ceiling": 1}\n')
    assert plot.main([str(empty), "-o", str(tmp_path / "t.png")]) == 1  # no epoch yet: nothing to draw
    assert not (tmp_path / "t.png").exists()
