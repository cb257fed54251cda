"""dstk.open: random access to a dataset directory through the library."""
import json
import os

import numpy as np

from . import _dstk

_NUMPY_DTYPES = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16, "i32": np.int32,
                 "i64": np.int64, "f16": np.float16, "bf16": np.uint16, "f32": np.float32, "f64": np.float64}


def open(path):
    """Opens the dataset directory ``path`` (its dataset.json checked against the files).

    Raises dstk.Error with the library's message (and exit_code) when the
    directory, the manifest or a file is missing or inconsistent.
    """
    return Dataset(path)


class Dataset:
    """A dataset directory: ``ds.splits``, ``ds.manifest``, ``ds["train"]["x"]``."""

    def __init__(self, path):
        self._ds = _dstk._Dataset.open(os.fspath(path))
        self.path = self._ds.path
        self.manifest = json.loads(self._ds.manifest_json())
        """dataset.json as a dict (splits, fields, stats, provenance)."""

    @property
    def splits(self):
        """Names of the splits, in manifest order."""
        return [s["name"] for s in self.manifest["splits"]]

    def __getitem__(self, split):
        for s in self.manifest["splits"]:
            if s["name"] == split:
                return Split(self, s)
        self._ds.check(split, "")  # raises the library's message, which lists the splits
        raise KeyError(split)

    def field(self, split, field, widen=False):
        """``Field`` ``field`` of ``split``; widen=True returns bf16/f16 values as float32."""
        return self[split].field(field, widen)

    def verify(self):
        """Re-reads every file and checks sizes and checksums (raises dstk.Error naming the first bad one)."""
        self._ds.verify()

    def __repr__(self):
        return f"dstk.Dataset({self.path!r}, splits={self.splits})"


class Split:
    """One split: ``name``, ``samples``, ``fields`` (names); ``split["x"]`` is a Field."""

    def __init__(self, dataset, info):
        self._dataset = dataset
        self._info = info
        self.name = info["name"]
        self.samples = info["samples"]
        self.fields = [f["name"] for f in info["fields"]]

    def __getitem__(self, field):
        return self.field(field)

    def field(self, field, widen=False):
        for f in self._info["fields"]:
            if f["name"] == field:
                return Field(self._dataset, self, f, widen)
        self._dataset._ds.check(self.name, field)  # raises the library's message
        raise KeyError(field)

    def __repr__(self):
        return f"dstk.Split({self.name!r}, samples={self.samples}, fields={self.fields})"


class Field:
    """One field of one split, indexed like a NumPy array along its samples.

    ``field[i]``, ``field[a:b:s]``, ``field[[i, j, k]]`` return NumPy arrays of
    shape ``(n, *sample_shape)`` (``sample_shape`` for an integer index).
    ``.npy`` storage: read through a read-only memory map (``field.numpy()`` is
    the map itself). zstd-chunked storage: only the chunks holding the asked
    samples are read and decoded, by the library's reader.

    ``dtype`` is the stored dtype's name ("u8", "bf16", ...); ``numpy_dtype``
    what arrays come back as. NumPy has no bfloat16: bf16 comes back as its raw
    uint16 bits unless the field was opened with widen=True (then float32, as
    f16 is; f16 otherwise comes back as numpy.float16).
    """

    def __init__(self, dataset, split, info, widen):
        self._dataset = dataset
        self._split = split.name
        self._info = info
        self.name = info["name"]
        self.dtype = info["dtype"]
        self.storage = info["storage"]
        self.chunk_samples = info.get("chunk_samples", 0)
        self.samples = split.samples
        self.sample_shape = tuple(info["shape"])
        self.shape = (self.samples,) + self.sample_shape
        self.widen = bool(widen) and self.dtype in ("bf16", "f16")
        self.numpy_dtype = np.dtype(np.float32 if self.widen else _NUMPY_DTYPES[self.dtype])
        self._map = None

    def __len__(self):
        return self.samples

    def _memmap(self):
        if self._map is None:
            self._map = np.load(os.path.join(self._dataset.path, self._info["file"]), mmap_mode="r")
            if self.dtype == "bf16":
                self._map = self._map.view(np.uint16)
        return self._map

    def numpy(self):
        """The whole field: the read-only memory map for .npy storage (unwidened), else a decoded copy."""
        if self.storage == "npy" and not self.widen:
            return self._memmap()
        return self._read(0, self.samples)

    def _read(self, first, count):
        return self._dataset._ds.read(self._split, self.name, int(first), int(count), self.widen)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            i = int(index) + (self.samples if index < 0 else 0)
            if not 0 <= i < self.samples:
                raise IndexError(f"sample {index} out of range for {self.samples} samples")
            if self.storage == "npy" and not self.widen:
                return self._memmap()[i]
            return self._read(i, 1)[0]
        if self.storage == "npy" and not self.widen:
            return self._memmap()[index]
        if isinstance(index, slice):
            start, stop, step = index.indices(self.samples)
            if step == 1:
                return self._read(start, max(0, stop - start))
            positions = np.arange(start, stop, step)
        else:
            positions = np.asarray(index)
            if positions.dtype == bool:
                positions = np.flatnonzero(positions)
            positions = np.where(positions < 0, positions + self.samples, positions).astype(np.int64)
            if positions.size and (positions.min() < 0 or positions.max() >= self.samples):
                raise IndexError(f"index out of range for {self.samples} samples")
        return self._gather(positions.reshape(-1)).reshape(np.shape(positions) + self.sample_shape)

    def _gather(self, positions):
        """Reads the runs of consecutive positions once each, in sorted order, then puts them in place."""
        out = np.empty((positions.size,) + self.sample_shape, self.numpy_dtype)
        if positions.size == 0:
            return out
        order = np.argsort(positions, kind="stable")
        sorted_pos = positions[order]
        breaks = np.flatnonzero(np.diff(sorted_pos) > 1) + 1
        for run in np.split(np.arange(sorted_pos.size), breaks):
            first, last = sorted_pos[run[0]], sorted_pos[run[-1]]
            block = self._read(first, last - first + 1)
            out[order[run]] = block[sorted_pos[run] - first]
        return out

    def __repr__(self):
        return (f"dstk.Field({self._split}/{self.name}, dtype={self.dtype}, shape={self.shape}, "
                f"storage={self.storage}{', widened to float32' if self.widen else ''})")
