"""dstk.open: random access to a dataset directory through the library."""
import json
import operator
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


class _NotInDataset(_dstk.Error, KeyError):
    """A split or field the manifest lacks: a KeyError, as a mapping's miss is, carrying the library's
    message (which lists the names there are) and exit_code, as every dstk.Error does."""

    __str__ = _dstk.Error.__str__  # the message as it is, not KeyError's quoted repr of it


def _check_name(what, name, names):
    if not isinstance(name, str):
        raise TypeError(f"{what} names are strings ({', '.join(map(repr, names))}), not {type(name).__name__} "
                        f"{name!r}: index by name")


def _not_in_dataset(error):
    """The library's error for a missing split or field, raised again as a KeyError too."""
    e = _NotInDataset(str(error))
    e.exit_code = error.exit_code
    return e


class Dataset:
    """A dataset directory: ``ds.splits``, ``ds.manifest``, ``ds["train"]["x"]``.

    Pickles as its path (a worker process, e.g. a PyTorch DataLoader's under
    spawn, opens the directory again); so do its Splits and Fields.
    """

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
        """Split ``split``; raises KeyError (also a dstk.Error, with the library's message) when there is none."""
        _check_name("split", split, self.splits)
        for s in self.manifest["splits"]:
            if s["name"] == split:
                return Split(self, s)
        try:
            self._ds.check(split, "")  # raises the library's message, which lists the splits
        except _dstk.Error as e:
            raise _not_in_dataset(e) from None
        raise KeyError(split)

    def field(self, split, field, widen=False):
        """``Field`` ``field`` of ``split``; widen=True returns bf16/f16 values as float32."""
        return self[split].field(field, widen)

    def verify(self):
        """Re-reads every file and checks sizes and checksums (raises dstk.Error naming the first bad one)."""
        self._ds.verify()

    def __reduce__(self):
        # The library's handle holds open files: a copy in another process opens the directory again
        # (absolute: that process may run elsewhere).
        return Dataset, (os.path.abspath(self.path),)

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
        """Field ``field``; raises KeyError (also a dstk.Error, with the library's message) when there is none."""
        _check_name("field", field, self.fields)
        for f in self._info["fields"]:
            if f["name"] == field:
                return Field(self._dataset, self, f, widen)
        try:
            self._dataset._ds.check(self.name, field)  # raises the library's message
        except _dstk.Error as e:
            raise _not_in_dataset(e) from None
        raise KeyError(field)

    def __reduce__(self):
        return operator.getitem, (self._dataset, self.name)  # the dataset reopens from its path

    def __repr__(self):
        return f"dstk.Split({self.name!r}, samples={self.samples}, fields={self.fields})"


_VALID_INDICES = ("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and integer or "
                  "boolean arrays are valid indices")


def _index_part(part):
    """One part of an index in the form NumPy reads it: None, Ellipsis, a slice, an int, a NumPy bool
    scalar, or an integer or boolean array; IndexError, as NumPy's, for anything else (floats)."""
    if part is None or part is Ellipsis or isinstance(part, slice):
        return part
    if isinstance(part, (bool, np.bool_)):
        return np.bool_(part)  # a 0-d mask: adds an axis, indexes none (not sample 0 or 1)
    if isinstance(part, (int, np.integer)):
        return int(part)
    if isinstance(part, (np.ndarray, list, tuple)):
        array = np.asarray(part)
        if array.dtype == bool or array.dtype.kind in "iu":
            return array
        if array.size == 0 and not isinstance(part, np.ndarray):
            return array.astype(np.intp)  # [] selects nothing, as in NumPy
        raise IndexError(_VALID_INDICES)
    try:
        return operator.index(part)
    except TypeError:
        raise IndexError(_VALID_INDICES) from None


def _axes_indexed(part):
    if part is None or isinstance(part, np.bool_):
        return 0
    if isinstance(part, np.ndarray) and part.dtype == bool:
        return part.ndim
    return 1


def _samples_part(parts, ndim):
    """Which of ``parts`` indexes axis 0, the samples; None where none does (no part, only new axes, or
    an Ellipsis that spans axis 0: every sample)."""
    if sum(p is Ellipsis for p in parts) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    indexed = sum(_axes_indexed(p) for p in parts if p is not Ellipsis)
    if indexed > ndim:
        raise IndexError(f"too many indices for array: array is {ndim}-dimensional, but {indexed} were indexed")
    for i, p in enumerate(parts):
        if p is Ellipsis:
            if indexed < ndim:
                return None
        elif _axes_indexed(p):
            return i
    return None


def _check_bounds(low, high, samples):
    for i in (low, high):
        if not -samples <= i < samples:
            raise IndexError(f"index {i} is out of bounds for axis 0 with size {samples} (the field's samples)")


class Field:
    """One field of one split, indexed as a NumPy array of shape ``(samples, *sample_shape)`` is.

    ``field[index]`` equals ``field.numpy()[index]`` for every NumPy index
    (``field[i]``, ``field[a:b:s]``, ``field[[i, j, k]]``, a boolean mask over
    the samples, ``field[i, 0]``, ``field[:, 0]``, ``field[..., 0]``, ...),
    errors included. ``.npy`` storage: read through a read-only memory map
    (``field.numpy()`` is the map itself). zstd-chunked storage (and widened
    fields): only the samples the index selects along axis 0 are read (only the
    chunks holding them decoded, by the library's reader), then the rest of the
    index applies to them.

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
        if self.storage == "npy" and not self.widen:
            return self._memmap()[index]
        # NumPy's indexing without the whole field in memory: read the samples the index's part for
        # axis 0 selects, then index them with that part rewritten to select the same rows from them.
        parts = [_index_part(p) for p in (index if isinstance(index, tuple) else (index,))]
        at = _samples_part(parts, len(self.shape))
        if at is None:
            return self._read(0, self.samples)[tuple(parts)]
        block, parts[at] = self._select(parts[at])
        return block[tuple(parts)]

    def _select(self, part):
        """The samples ``part`` selects along axis 0, and the part that selects them all, in its order and
        shape, from what was read."""
        n = self.samples
        if isinstance(part, slice):
            start, stop, step = part.indices(n)
            if step == 1:
                return self._read(start, max(0, stop - start)), slice(None)
            return self._gather(np.arange(start, stop, step)), slice(None)
        if isinstance(part, int):
            _check_bounds(part, part, n)
            return self._read(part % n, 1), 0
        if part.dtype == bool:
            if part.shape[0] != n:
                raise IndexError(f"boolean index did not match indexed array along axis 0; size of axis is {n} "
                                 f"but size of corresponding boolean axis is {part.shape[0]}")
            rows = np.flatnonzero(part.any(axis=tuple(range(1, part.ndim))))
            return self._gather(rows), part[rows]
        if part.size:
            _check_bounds(part.min(), part.max(), n)
        positions = np.where(part < 0, part + n, part).astype(np.int64)
        rows, inverse = np.unique(positions, return_inverse=True)  # each sample read once
        return self._gather(rows), inverse.reshape(positions.shape)

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

    def __reduce__(self):
        return self._dataset.field, (self._split, self.name, self.widen)  # the dataset reopens from its path

    def __repr__(self):
        return (f"dstk.Field({self._split}/{self.name}, dtype={self.dtype}, shape={self.shape}, "
                f"storage={self.storage}{', widened to float32' if self.widen else ''})")
