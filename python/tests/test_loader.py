"""dstk.Loader on the cpu backend: orders, conversion, resume, errors, Ctrl-C."""
import json
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dstk
from conftest import N

BATCH = 32


def epoch_labels(loader):
    return np.concatenate([y for _, y in loader])


@pytest.mark.parametrize("storage", ["npy", "zstd"])
@pytest.mark.parametrize("order", ["sequential", "chunk", "full"])
def test_batches_follow_the_library_order(index_sets, storage, order):
    chunk = 64 if storage == "zstd" else 50  # a chunked file orders by its own chunk
    for seed in (0, 7):
        loader = dstk.Loader(index_sets[storage], batch=BATCH, order=order, seed=seed, placement="host",
                             chunk=50, window=3, convert=False)
        assert len(loader) == N // BATCH
        for epoch in (0, 1, 3):
            loader.set_epoch(epoch)
            got = epoch_labels(loader)
            want = dstk.order_indices(N, epoch, order, seed, chunk, 3)[:len(loader) * BATCH]
            np.testing.assert_array_equal(got, want)
        assert loader.epoch == 4


def test_orders_differ_by_seed_and_epoch():
    a = dstk.order_indices(N, 0, "full", 1)
    assert sorted(a) == list(range(N))
    assert not np.array_equal(a, dstk.order_indices(N, 1, "full", 1))
    assert not np.array_equal(a, dstk.order_indices(N, 0, "full", 2))
    np.testing.assert_array_equal(dstk.order_indices(N, 5, "sequential"), np.arange(N))


def test_x_matches_the_dataset(index_sets):
    raw = dstk.open(index_sets["zstd"])["train"]["x"].numpy()
    for x, y in dstk.Loader(index_sets["zstd"], batch=BATCH, order="full", placement="host", convert=False):
        assert x.dtype == np.uint8 and x.shape == (BATCH, 3, 2, 2)
        np.testing.assert_array_equal(x, raw[y])


def test_conversion_and_normalisation(images):
    ds = dstk.open(images)
    stats = ds.manifest["stats"]
    raw = ds["train"]["x"].numpy().astype(np.float32)
    loader = dstk.Loader(images, batch=64, order="chunk", seed=3, placement="host", chunk=100, drop_last=False)
    np.testing.assert_allclose(loader.mean, stats["mean"], rtol=1e-6)
    mean = np.asarray(loader.mean, np.float32).reshape(1, 3, 1, 1)
    inv = (1 / np.asarray(loader.std, np.float32)).reshape(1, 3, 1, 1)
    order = dstk.order_indices(600, 0, "chunk", 3, 100, 8)
    seen = 0
    for x, y in loader:
        assert x.dtype == np.float32 and x.shape[1:] == (3, 8, 8)
        idx = order[seen:seen + len(x)]
        np.testing.assert_allclose(x, (raw[idx] - mean) * inv, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(y, ds["train"]["y"][:][idx])
        seen += len(x)
    assert seen == 600  # drop_last=False keeps the partial batch
    plain = next(iter(dstk.Loader(images, batch=8, order="sequential", placement="host", normalize=False)))[0]
    np.testing.assert_array_equal(plain, raw[:8])
    custom = next(iter(dstk.Loader(images, batch=8, order="sequential", placement="host", mean=[10, 20, 30],
                                   std=[2, 4, 5])))[0]
    np.testing.assert_allclose(custom, (raw[:8] - np.array([10, 20, 30], np.float32).reshape(1, 3, 1, 1)) /
                               np.array([2, 4, 5], np.float32).reshape(1, 3, 1, 1), rtol=1e-6)


@pytest.mark.parametrize("storage", ["npy", "zstd"])
@pytest.mark.parametrize("order", ["chunk", "full"])
@pytest.mark.parametrize("placement", ["host", "device"])
def test_resume_mid_epoch(index_sets, storage, order, placement):
    settings = dict(batch=BATCH, order=order, seed=11, placement=placement, device="cpu", chunk=50, convert=False)
    full = dstk.Loader(index_sets[storage], **settings)
    full.set_epoch(2)
    whole = [y for _, y in full]
    first = dstk.Loader(index_sets[storage], **settings)
    first.set_epoch(2)
    for k, (_, y) in enumerate(first):
        np.testing.assert_array_equal(y, whole[k])
        if k == 9:
            break
    state = first.state_dict()
    assert (state["epoch"], state["batch"]) == (2, 10)
    resumed = dstk.Loader(index_sets[storage], **settings)
    resumed.load_state_dict(state)
    rest = [y for _, y in resumed]
    assert len(rest) == len(whole) - 10
    for a, b in zip(rest, whole[10:]):
        np.testing.assert_array_equal(a, b)
    assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["batch"] == 0
    # The first loader, iterated again, also continues where it stopped.
    np.testing.assert_array_equal(np.concatenate([y for _, y in first]), np.concatenate(whole[10:]))


def test_resume_refuses_other_settings(index_sets):
    state = dstk.Loader(index_sets["npy"], batch=BATCH, seed=1, placement="host", convert=False).state_dict()
    other = dstk.Loader(index_sets["npy"], batch=BATCH, seed=2, placement="host", convert=False)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_ceilings_and_times(index_sets):
    loader = dstk.Loader(index_sets["zstd"], batch=BATCH, placement="host", prefetch=3, convert=False)
    assert loader.host_bytes >= 3 * BATCH * (12 + 4)
    assert loader.device_bytes > 0 and not loader.on_gpu
    for _ in loader:
        pass
    t = loader.times
    assert t["batches"] == len(loader) and t["samples"] == len(loader) * BATCH
    assert t["decode"] > 0 and t["read_wait"] >= 0


@pytest.mark.parametrize("kwargs, message, code", [
    (dict(batch=0), "batch", 2),
    (dict(batch=N + 1), "larger than split", 2),
    (dict(order="random"), "random", 2),
    (dict(placement="everywhere"), "everywhere", 2),
    (dict(placement="managed", device="cpu"), "managed", 2),
    (dict(split="validation"), "validation", 1),
    (dict(mean=[1, 2], std=[1, 2]), "3 channels", 2),
])
def test_bad_settings_raise_library_errors(index_sets, kwargs, message, code):
    settings = dict(placement="host", batch=BATCH, convert="mean" in kwargs)
    settings.update(kwargs)
    with pytest.raises(dstk.Error, match=message) as e:
        dstk.Loader(index_sets["npy"], **settings)
    assert e.value.exit_code == code


def test_missing_stats_are_computed_as_dstrain_computes_them(index_sets, tmp_path):
    # Imports now write statistics: a copy of the dataset without them.
    bare = tmp_path / "bare"
    shutil.copytree(index_sets["npy"], bare)
    manifest = json.loads((bare / "dataset.json").read_text())
    manifest.pop("stats", None)
    for split in manifest["splits"]:
        for field in split["fields"]:
            field.pop("stats", None)
    (bare / "dataset.json").write_text(json.dumps(manifest))
    loader = dstk.Loader(bare, placement="host")  # a scan of the training split, as dstrain's
    x = dstk.open(bare)["train"]["x"].numpy().astype(np.float64)
    np.testing.assert_allclose(loader.mean, x.mean(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(loader.std, x.std(axis=(0, 2, 3)), rtol=1e-4)


def test_loader_bad_path(tmp_path):
    with pytest.raises(dstk.Error, match="missing") as e:
        dstk.Loader(tmp_path / "missing", placement="host")
    assert e.value.exit_code != 0


def test_ctrl_c_stops_the_epoch(images):
    script = textwrap.dedent(f"""
        import faulthandler, signal, sys, dstk
        faulthandler.dump_traceback_later(20)  # a hang shows where every thread is
        # Ctrl-C as an interactive shell delivers it, even where this test runs as a
        # background job (started with SIGINT ignored, which the child inherits).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = dstk.Loader({str(images)!r}, batch=8, placement="host", order="full", readers=1, prefetch=1)
        print("started", flush=True)
        try:
            while True:
                for x, y in loader:
                    pass
        except KeyboardInterrupt:
            print("interrupted at epoch", loader.state_dict()["epoch"], flush=True)
            sys.exit(0)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    import time
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"no exit 30 s after SIGINT; its stderr:\n{err}")
    assert p.returncode == 0, err
    assert "interrupted at epoch" in out


def test_help_documents_the_loader():
    doc = dstk.Loader.__doc__
    for word in ("placement", "Batch lifetime", "state_dict", "DLPack", "KeyboardInterrupt", "order_indices"):
        assert word in doc


@pytest.mark.parametrize("storage", ["npy", "zstd"])
def test_int64_labels_equal_the_stored_int32(index_sets, storage):
    kw = dict(batch=BATCH, order="full", seed=4, placement="host", convert=False)
    for (x32, y32), (x64, y64) in zip(dstk.Loader(index_sets[storage], **kw),
                                      dstk.Loader(index_sets[storage], labels="int64", **kw)):
        assert y32.dtype == np.int32 and y64.dtype == np.int64
        np.testing.assert_array_equal(y64, y32)
        np.testing.assert_array_equal(x64, x32)


def test_bad_output_and_labels_raise(images):
    with pytest.raises(ValueError, match="output='jax'"):
        dstk.Loader(images, placement="host", output="jax")
    with pytest.raises(ValueError, match="labels='int16'"):
        dstk.Loader(images, placement="host", labels="int16")


def test_torch_output_on_the_cpu(images):
    try:
        import torch
    except ImportError:  # the message names what to install and the other choice
        with pytest.raises(ImportError, match="pip install torch.*output='arrays'"):
            dstk.Loader(images, placement="host", output="torch")
        return
    kw = dict(batch=64, order="chunk", seed=3, placement="host", chunk=100)
    for (x, y), (tx, ty) in zip(dstk.Loader(images, **kw), dstk.Loader(images, output="torch", **kw)):
        assert isinstance(tx, torch.Tensor) and ty.dtype == torch.int64
        np.testing.assert_array_equal(tx.numpy(), x)
        np.testing.assert_array_equal(ty.numpy(), y)
