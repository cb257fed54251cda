"""dstk.open: every dtype and both storages against NumPy; errors carry the library's message; datasets,
splits and fields pickle (to worker processes)."""
import multiprocessing
import operator
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import dstk
from conftest import make_dataset

DTYPES = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16, "i32": np.int32, "i64": np.int64,
          "f16": np.float16, "f32": np.float32, "f64": np.float64}
SAMPLES = 300


def source(dtype):
    rng = np.random.default_rng(5)
    if np.dtype(dtype).kind == "f":
        return (rng.integers(-1000, 1000, size=(SAMPLES, 2, 5)) / 8).astype(dtype)  # exact in every float type
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(SAMPLES, 2, 5), endpoint=True, dtype=dtype)


@pytest.fixture(scope="module", params=["npy", "zstd"])
def storage(request):
    return request.param


def open_as(tmp_path_factory, name, x, storage, *extra):
    tmp = tmp_path_factory.mktemp(name)
    args = ["--compress", "zstd", "--chunk-samples", 32] if storage == "zstd" else []
    arrays = {"x_train": x, "y_train": np.arange(len(x), dtype=np.int32)}
    return dstk.open(make_dataset(tmp, name, arrays, *args, *extra))


def check_indexing(field, expect):
    np.testing.assert_array_equal(field[:], expect)
    np.testing.assert_array_equal(field[7], expect[7])
    np.testing.assert_array_equal(field[-1], expect[-1])
    np.testing.assert_array_equal(field[30:70], expect[30:70])  # crosses chunk boundaries
    np.testing.assert_array_equal(field[5:290:37], expect[5:290:37])
    picks = [250, 3, 4, 5, 99, 3, 31, 32]
    np.testing.assert_array_equal(field[picks], expect[picks])
    np.testing.assert_array_equal(field.numpy(), expect)
    with pytest.raises(IndexError):
        field[SAMPLES]


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_dtype_round_trip(tmp_path_factory, storage, name):
    x = source(DTYPES[name])
    ds = open_as(tmp_path_factory, name, x, storage)
    assert ds.splits == ["train"]
    field = ds["train"]["x"]
    assert (field.dtype, field.storage, field.shape) == (name, "npy" if storage == "npy" else "zstd-chunked",
                                                         (SAMPLES, 2, 5))
    assert field.numpy_dtype == x.dtype
    check_indexing(field, x)
    if name == "f16":
        check_indexing(ds.field("train", "x", widen=True), x.astype(np.float32))
    np.testing.assert_array_equal(ds["train"]["y"][:], np.arange(SAMPLES))


def test_bf16_raw_and_widened(tmp_path_factory, storage):
    rng = np.random.default_rng(6)  # 8 significant bits: exact in bf16
    x = (rng.integers(-255, 256, size=(SAMPLES, 2, 5)) / 8).astype(np.float32)
    ds = open_as(tmp_path_factory, "bf16", x, storage, "--dtype", "bf16")
    raw = ds["train"]["x"]
    assert raw.dtype == "bf16" and raw.numpy_dtype == np.uint16
    check_indexing(raw, (x.view(np.uint32) >> 16).astype(np.uint16))
    wide = ds.field("train", "x", widen=True)
    assert wide.numpy_dtype == np.float32
    check_indexing(wide, x)


def test_manifest_and_memmap(tmp_path_factory):
    x = source(np.uint8)
    ds = open_as(tmp_path_factory, "meta", x, "npy")
    assert ds.manifest["splits"][0]["name"] == "train"
    assert [f["name"] for f in ds.manifest["splits"][0]["fields"]] == ds["train"].fields
    assert isinstance(ds["train"]["x"].numpy(), np.memmap)


def test_bad_path_raises_library_message(tmp_path):
    with pytest.raises(dstk.Error) as e:
        dstk.open(tmp_path / "nope")
    assert "nope" in str(e.value) and e.value.exit_code in (1, 2, 3)
    assert isinstance(e.value, RuntimeError)


def test_unknown_split_and_field(images):
    ds = dstk.open(images)
    with pytest.raises(dstk.Error, match="train"):  # the library lists the splits
        ds["validation"]
    with pytest.raises(dstk.Error, match="nofield"):
        ds["train"]["nofield"]


def corrupt_middle(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
    path.write_bytes(bytes(data))


def test_corrupt_chunk_raises(tmp_path_factory):
    x = source(np.uint8)
    ds = open_as(tmp_path_factory, "corrupt", x, "zstd")
    corrupt_middle(Path(ds.path) / ds.manifest["splits"][0]["fields"][0]["file"])
    ds = dstk.open(ds.path)
    with pytest.raises(dstk.Error, match="chunk") as e:
        ds["train"]["x"][:]
    assert e.value.exit_code == 1
    with pytest.raises(dstk.Error, match="chunk"):
        for _ in dstk.Loader(ds.path, batch=16, placement="host", convert=False):
            pass


def test_missing_names_raise_key_error_with_the_librarys_message(images):
    ds = dstk.open(images)
    with pytest.raises(KeyError, match="train") as e:  # the library lists the splits
        ds["nosplit"]
    assert isinstance(e.value, dstk.Error) and e.value.exit_code == 1 and "'nosplit'" in str(e.value)
    with pytest.raises(KeyError, match="nofield"):
        ds["train"]["nofield"]
    with pytest.raises(TypeError, match="split names are strings"):
        ds[0]
    with pytest.raises(TypeError, match="field names are strings"):
        ds["train"][0]


@pytest.fixture(scope="module")
def pickled_sets(tmp_path_factory):
    """(dataset, x): zstd-chunked bf16 (chunks of 32) and the float32 source it holds exactly."""
    rng = np.random.default_rng(8)
    x = (rng.integers(-255, 256, size=(SAMPLES, 2, 5)) / 8).astype(np.float32)
    return open_as(tmp_path_factory, "pickled", x, "zstd", "--dtype", "bf16"), x


def test_pickle_round_trip_reopens_the_same_data(pickled_sets):
    ds, x = pickled_sets
    again = pickle.loads(pickle.dumps(ds))
    assert again.path == os.path.abspath(ds.path) and again.splits == ds.splits
    split = pickle.loads(pickle.dumps(ds["train"]))
    assert (split.name, split.samples, split.fields) == ("train", SAMPLES, ds["train"].fields)
    for widen in (False, True):
        field = pickle.loads(pickle.dumps(ds.field("train", "x", widen=widen)))
        assert (field.name, field.widen, field.numpy_dtype) == ("x", widen, np.float32 if widen else np.uint16)
        np.testing.assert_array_equal(field[:], ds.field("train", "x", widen=widen)[:])
    np.testing.assert_array_equal(field[[3, 1]], x[[3, 1]])


def test_field_read_in_spawned_processes(pickled_sets):
    """A PyTorch map-style Dataset over a Field under DataLoader(num_workers > 0) with spawn: the field goes
    to each worker pickled."""
    ds, x = pickled_sets
    field = ds.field("train", "x", widen=True)
    indices = [0, 37, slice(30, 70), [299, 5]]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        got = pool.starmap(operator.getitem, [(field, i) for i in indices])
    for i, g in zip(indices, got):
        np.testing.assert_array_equal(g, x[i])
