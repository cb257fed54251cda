"""dstk.Loader over every array of a sample (issue 24), on the CPU: chess-shaped
data (positions i8[12,8,8], moves i32, results i8) and an unlabelled
neuroscience-shaped set; every yielded field equals the source arrays at the
loader's own indices for several (seed, epoch) in every order and storage;
resume; kinds; the CPU fallback; the same statistics and the same plan as
dstrain and dsplan."""
import json
import shutil
import subprocess
import warnings

import numpy as np
import pytest

import dstk
from conftest import BIN, make_dataset, tool

ITEMSIZE = {"u8": 1, "i8": 1, "u16": 2, "i16": 2, "f16": 2, "bf16": 2, "i32": 4, "f32": 4, "i64": 8, "f64": 8}

N = 600
CHESS = ["positions", "moves", "results"]


def chess_arrays():
    r = np.random.default_rng(24)
    return {"positions": r.integers(-1, 2, (N, 12, 8, 8)).astype(np.int8),
            "moves": r.integers(0, 4672, N).astype(np.int32),
            "results": r.integers(-1, 2, N).astype(np.int8)}


@pytest.fixture(scope="module")
def chess(tmp_path_factory):
    """{"arrays": the source arrays, "npy": dir, "zstd": dir (chunks of 64)}."""
    tmp = tmp_path_factory.mktemp("chess")
    a = chess_arrays()
    roles = ("--input", "positions", "--label", "moves")
    return {"arrays": a, "npy": make_dataset(tmp, "npy", a, *roles),
            "zstd": make_dataset(tmp, "zstd", a, *roles, "--compress", "zstd", "--chunk-samples", 64)}


@pytest.fixture(scope="module")
def neuro(tmp_path_factory):
    """An unlabelled set without roles: stim u8[1,12,12], robs f32[20], behavior f32[4]."""
    r = np.random.default_rng(7)
    a = {"stim": r.integers(0, 256, (N, 1, 12, 12)).astype(np.uint8),
         "robs": r.random((N, 20), dtype=np.float32), "behavior": r.random((N, 4), dtype=np.float32)}
    return a, make_dataset(tmp_path_factory.mktemp("neuro"), "neuro", a)


def host(path, **kw):
    return dstk.Loader(path, placement="host", batch=32, drop_last=False, **kw)


@pytest.mark.parametrize("storage", ["npy", "zstd"])
@pytest.mark.parametrize("order", ["sequential", "chunk", "full"])
def test_every_field_equals_the_arrays_at_the_loaders_indices(chess, storage, order):
    a = chess["arrays"]
    for seed in (0, 5):
        loader = host(chess[storage], fields=CHESS, order=order, seed=seed, chunk=50, window=3)
        assert loader.fields["positions"]["kind"] == "normalised"
        assert loader.fields["moves"]["kind"] == "classes32" and loader.fields["results"]["kind"] == "values"
        mean = np.asarray(loader.mean, np.float32).reshape(1, 12, 1, 1)
        inv = (1 / np.asarray(loader.std, np.float32)).reshape(1, 12, 1, 1)
        for epoch in (0, 2):
            loader.set_epoch(epoch)
            idx = dstk.order_indices(N, epoch, order, seed, loader.chunk, 3)
            seen = 0
            for b in loader:
                assert list(b) == CHESS
                i = idx[seen:seen + len(b["moves"])]
                assert b["positions"].dtype == np.float32 and b["positions"].shape[1:] == (12, 8, 8)
                np.testing.assert_allclose(b["positions"], (a["positions"][i] - mean) * inv, rtol=1e-5, atol=1e-5)
                assert b["moves"].dtype == np.int32
                np.testing.assert_array_equal(b["moves"], a["moves"][i])
                assert b["results"].dtype == np.float32
                np.testing.assert_array_equal(b["results"], a["results"][i].astype(np.float32))
                seen += len(i)
            assert seen == N


def test_as_tuple_and_kinds(chess):
    a = chess["arrays"]
    loader = host(chess["npy"], fields=["results", "positions", "moves"], as_tuple=True, order="full", seed=3,
                  labels="int64", convert={"positions": False, "results": "int32"})
    idx = dstk.order_indices(N, 0, "full", 3)
    seen = 0
    for results, positions, moves in loader:
        i = idx[seen:seen + len(moves)]
        assert positions.dtype == np.int8 and moves.dtype == np.int64 and results.dtype == np.int32
        np.testing.assert_array_equal(positions, a["positions"][i])
        np.testing.assert_array_equal(moves, a["moves"][i])
        np.testing.assert_array_equal(results, a["results"][i])
        seen += len(i)
    assert seen == N
    with pytest.raises(ValueError, match="convert"):
        host(chess["npy"], fields=CHESS, convert={"moves": "int8"})
    with pytest.raises(dstk.Error, match="'board', which is not among the fields"):
        host(chess["npy"], fields=CHESS, convert={"board": False})


def test_the_default_fields_are_the_input_and_label_roles(chess):
    x, y = next(iter(host(chess["npy"], order="sequential")))
    assert x.shape == (32, 12, 8, 8) and x.dtype == np.float32  # int8 inputs are widened like u8
    np.testing.assert_array_equal(y, chess["arrays"]["moves"][:32])


@pytest.mark.parametrize("placement", ["host", "device"])
def test_resume_mid_epoch(chess, placement):
    kw = dict(fields=CHESS, order="chunk", seed=11, chunk=40, placement=placement, device="cpu", batch=32)
    whole = [b["moves"] for b in dstk.Loader(chess["zstd"], **kw)]
    first = dstk.Loader(chess["zstd"], **kw)
    for k, _ in enumerate(first):
        if k == 6:
            break
    resumed = dstk.Loader(chess["zstd"], **kw)
    resumed.load_state_dict(first.state_dict())
    rest = [b["moves"] for b in resumed]
    assert len(rest) == len(whole) - 7
    for got, want in zip(rest, whole[7:]):
        np.testing.assert_array_equal(got, want)
    other = dstk.Loader(chess["zstd"], **{**kw, "fields": ["moves"]})
    with pytest.raises(ValueError, match="fields"):
        other.load_state_dict(first.state_dict())


def test_an_unlabelled_dataset_loads_the_fields_it_is_asked_for(neuro):
    a, path = neuro
    loader = host(path, fields=["stim"], order="full", seed=1)
    idx = dstk.order_indices(N, 0, "full", 1)
    seen = 0
    for b in loader:
        i = idx[seen:seen + len(b["stim"])]
        assert b["stim"].dtype == np.float32  # no input role: float values, not normalised
        np.testing.assert_array_equal(b["stim"], a["stim"][i].astype(np.float32))
        seen += len(i)
    assert seen == N
    b = next(iter(host(path, fields=["robs", "behavior"], order="sequential")))
    np.testing.assert_array_equal(b["robs"], a["robs"][:32])
    np.testing.assert_array_equal(b["behavior"], a["behavior"][:32])
    with pytest.raises(dstk.Error, match="fields") as e:  # no roles: the default fields cannot be chosen
        host(path)
    assert e.value.exit_code == 2
    with pytest.raises(dstk.Error, match="not integer classes"):
        host(path, fields=["robs"], convert={"robs": "int64"})


def test_without_a_gpu_the_loader_falls_back_to_numpy_with_a_notice(chess):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = dstk.Loader(chess["npy"], fields=CHESS, batch=32)
    if loader.on_gpu:
        pytest.skip("this machine has a GPU: no fallback")
    assert any("no GPU" in str(w.message) and issubclass(w.category, RuntimeWarning) for w in caught), \
        [str(w.message) for w in caught]
    assert loader.device == "cpu"
    b = next(iter(loader))
    assert isinstance(b["positions"], np.ndarray) and b["positions"].dtype == np.float32
    # convert=False too (it failed with cudaErrorInsufficientDriver before).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = next(iter(dstk.Loader(chess["npy"], fields=CHESS, batch=32, convert=False, order="sequential")))
    np.testing.assert_array_equal(raw["positions"], chess["arrays"]["positions"][:32])


def strip_stats(src, dst):
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "dataset.json").read_text())
    manifest.pop("stats", None)
    for split in manifest["splits"]:
        for field in split["fields"]:
            field.pop("stats", None)
    (dst / "dataset.json").write_text(json.dumps(manifest))
    return dst


def test_a_dataset_without_statistics_loads_with_dstrains_mean_and_std(chess, tmp_path):
    bare = strip_stats(chess["npy"], tmp_path / "bare")
    loader = host(bare, fields=CHESS)
    positions = chess["arrays"]["positions"].astype(np.float64)
    np.testing.assert_allclose(loader.mean, positions.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loader.std, positions.std(axis=(0, 2, 3)), rtol=1e-4)
    # dstrain normalises with the same figures (its saved model records them).
    model = tmp_path / "model.safetensors"
    tool("dstrain", bare, "--device", "cpu", "-T", 2, "--model", "mlp:8", "--epochs", 1, "--max-steps", 1,
         "--batch", 32, "--save", model)
    header = json.loads(model.read_bytes()[8:8 + int.from_bytes(model.read_bytes()[:8], "little")])
    meta = header["__metadata__"]
    np.testing.assert_allclose(json.loads(meta["normalize_mean"]), loader.mean, rtol=1e-6)
    np.testing.assert_allclose(json.loads(meta["normalize_std"]), loader.std, rtol=1e-6)


def test_the_plan_is_the_one_dsplan_prints(chess):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dstk.Loader(chess["npy"], placement="stream", batch=64)
    out = subprocess.run([str(BIN / "dsplan"), "--dataset", str(chess["npy"]), "--data", "stream", "--batch", "64"],
                         check=True, capture_output=True, text=True).stdout
    printed = [line.strip() for line in out.splitlines() if line.strip().startswith("data path:")]
    assert printed == loader.describe()
    doc = json.loads(subprocess.run([str(BIN / "dsplan"), "--dataset", str(chess["npy"]), "--data", "stream",
                                     "--batch", "64", "--json"], check=True, capture_output=True, text=True).stdout)
    plan = loader.plan
    for key in ("placement", "device", "chunk_samples", "readers", "prefetch", "direct", "host_bytes",
                "device_bytes", "fields"):
        assert doc["data_path"][key] == plan[key], key
    # on the CPU, also keep + 1 (3) converted batches of 64: the arrays a loop holds
    out = sum(int(np.prod(f["shape"], dtype=np.int64)) * ITEMSIZE[f["dtype"]] for f in loader.fields.values())
    assert loader.host_bytes == plan["host_bytes"] + (0 if loader.on_gpu else 3 * 64 * out)
