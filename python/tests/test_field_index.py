"""Field indexing on the fields read through the library (zstd-chunked, widened): every NumPy index form
gives what NumPy gives on the same array, shape, values and error type alike, and reads only the samples
the index selects. The .npy field (NumPy's own memory map) runs the same cases as a check on the cases."""
import numpy as np
import pytest

import dstk
from conftest import make_dataset

SAMPLES = 100
RNG = np.random.default_rng(11)
MASK = RNG.random(SAMPLES) < 0.3
MASK2 = RNG.random((SAMPLES, 2)) < 0.3  # a mask over the samples and their first axis

VALID = {
    "int": 7, "negative int": -1, "numpy int": np.int64(42), "0-d int array": np.array(7),
    "slice": slice(10, 40), "step": slice(5, 90, 7), "reverse": slice(None, None, -3), "all": slice(None),
    "empty slice": slice(60, 20), "past the end": slice(90, 300),
    "list": [3, 0, 99, 3, -1], "2-d array": np.array([[1, 2], [40, -5]]), "uint array": np.array([9, 2], np.uint64),
    "empty list": [], "empty array": np.array([], np.int64),
    "mask": MASK, "mask as list": list(MASK), "empty mask": np.zeros(SAMPLES, bool), "2-d mask": MASK2,
    "0-d mask": True, "0-d false": np.bool_(False), "0-d mask and int": (True, 2),
    "int, int": (0, 1), "int, int, int": (5, 1, 3), "int, slice, int": (-1, slice(None), 2),
    ":, int": (slice(None), 0), "..., int": (Ellipsis, 0), "..., int, int": (Ellipsis, 1, 4),
    "int, ...": (3, Ellipsis), "empty ...": (Ellipsis, 4, 1, 2), "empty tuple": (),
    "None": None, "None, int": (None, 3), "None, slice, None, int": (None, slice(2, 6), None, 1),
    "array in a tuple": (np.array([1, 2]),), "arrays broadcast": ([1, 2], [0, 1]),
    "arrays apart": ([[1], [2]], slice(None), [0, 4]), "slice, array": (slice(3, 9), [1, 0]),
    "mask, int": (MASK, 1), "list in a tuple": ([4, 4, 0], 1, slice(1, 4)),
}
INVALID = {
    "float": 1.9, "numpy float": np.float64(2.0), "float after int": (0, 1.5), "float array": np.array([1.0, 2.0]),
    "short mask": np.array([True, False, True]), "long mask": np.ones(SAMPLES + 1, bool),
    "past the end": SAMPLES, "before the start": -SAMPLES - 1, "list past the end": [0, SAMPLES],
    "list before the start": [-SAMPLES - 1], "out of bounds within a sample": (slice(None), 7),
    "too many": (0, 0, 0, 0), "two ellipses": (Ellipsis, 0, Ellipsis), "string": "a",
}


def source():
    return (RNG.integers(-255, 256, size=(SAMPLES, 2, 5)) / 8).astype(np.float32)  # exact in bf16


@pytest.fixture(scope="module")
def fields(tmp_path_factory):
    """name -> (field, the array it holds)."""
    tmp = tmp_path_factory.mktemp("index")
    x = source()
    u8 = (np.arange(x.size) % 251).astype(np.uint8).reshape(x.shape)
    y = np.arange(SAMPLES, dtype=np.int32)
    zstd = ["--compress", "zstd", "--chunk-samples", 16]
    u8_npy = dstk.open(make_dataset(tmp, "u8_npy", {"x_train": u8, "y_train": y}))
    u8_zstd = dstk.open(make_dataset(tmp, "u8_zstd", {"x_train": u8, "y_train": y}, *zstd))
    bf16_npy = dstk.open(make_dataset(tmp, "bf16_npy", {"x_train": x, "y_train": y}, "--dtype", "bf16"))
    bf16_zstd = dstk.open(make_dataset(tmp, "bf16_zstd", {"x_train": x, "y_train": y}, "--dtype", "bf16", *zstd))
    return {"npy u8 (memory map)": (u8_npy["train"]["x"], u8), "zstd u8": (u8_zstd["train"]["x"], u8),
            "npy bf16 widened": (bf16_npy.field("train", "x", widen=True), x),
            "zstd bf16 widened": (bf16_zstd.field("train", "x", widen=True), x)}


FIELDS = ["npy u8 (memory map)", "zstd u8", "npy bf16 widened", "zstd bf16 widened"]


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("case", sorted(VALID))
def test_index_equals_numpys(fields, name, case):
    field, expect = fields[name]
    want = expect[VALID[case]]
    got = field[VALID[case]]
    assert got.shape == want.shape and got.dtype == field.numpy_dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_index_raises_numpys_error(fields, name, case):
    field, expect = fields[name]
    with pytest.raises(Exception) as want:
        expect[INVALID[case]]
    with pytest.raises(Exception) as got:
        field[INVALID[case]]
    assert type(got.value) is type(want.value), f"{got.value!r} where NumPy raises {want.value!r}"


@pytest.mark.parametrize("index, samples", [(5, 1), ((5, 1), 1), ([9, 3, 9], 2), (MASK, MASK.sum()),
                                            (slice(20, 30), 10), (slice(0, 40, 10), 4), ((Ellipsis, 0), SAMPLES)])
def test_reads_only_the_selected_samples(fields, monkeypatch, index, samples):
    field, _ = fields["zstd u8"]
    reads = []
    read = field._read
    monkeypatch.setattr(field, "_read", lambda first, count: reads.append(count) or read(first, count))
    field[index]
    assert sum(reads) == samples
