"""dstk.Loader: dstrain's data path as a Python iterable of batches."""
import json
import math
import numbers
import os
import warnings

from . import _dstk

_KINDS = {True: None, False: "stored", "stored": "stored", "float32": "float32", "int32": "int32", "int64": "int64",
          "normalised": "normalised"}


class DeviceArray:
    """A batch array in GPU memory, handed over through DLPack.

    ``torch.from_dlpack(a)``, ``cupy.from_dlpack(a)`` and ``jax.dlpack.from_dlpack(a)``
    take it without a copy. The consumer's stream (the ``stream`` argument of
    ``__dlpack__``, which those libraries pass) is made to wait for the batch's
    conversion, and its work then guards the batch's memory against reuse (see
    dstk.Loader's batch lifetime). ``shape`` and ``dtype`` describe it.
    """

    __slots__ = ("_array", "_loader", "_slot", "shape", "dtype")

    def __init__(self, array, loader, slot, shape, dtype):
        self._array = array
        self._loader = loader
        self._slot = slot
        self.shape = shape  # tuple of ints
        self.dtype = dtype  # NumPy's name: "float32", "uint8", ...; bf16 raw as "uint16"

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()

    def __dlpack__(self, stream=None, **kwargs):
        # DLPack: None or 1 is the legacy default stream, 2 the per-thread one,
        # -1 "do not synchronise"; CUDA's handles for those are 0, 1 and 2.
        if stream != -1:
            self._loader.wait_ready(self._slot, 0 if stream is None else int(stream))
        return self._array.__dlpack__(**kwargs)

    def __repr__(self):
        return f"dstk.DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.__dlpack_device__()})"


def _whole(name, value, minimum=0, maximum=2**64 - 1):
    """value as an int within [minimum, maximum], or ValueError naming the argument: a float with a
    fraction, a bool or a string is not a count (int() would truncate 1.7 to 1 silently)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
                and float(value).is_integer()):
            raise ValueError(f"{name}={value!r} must be a whole number")
    value = int(value)
    if not minimum <= value <= maximum:
        raise ValueError(f"{name}={value} is out of range (expected {minimum} to {maximum})")
    return value


def _optional(name, value, minimum=0):
    return 0 if value is None else _whole(name, value, minimum)


def _text(name, value):
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r} must be a string")
    return value


def _finite(name, values, positive=False):
    """A list of floats, each finite (and positive for std): NaN or inf would normalise to NaN or 0."""
    out = [float(v) for v in values]
    for v in out:
        if not math.isfinite(v) or (positive and v <= 0):
            raise ValueError(f"{name}={values!r}: every value must be a finite number" +
                             (" above 0" if positive else ""))
    return out


class Loader:
    """Batches of the named fields of one split, from the same C++ data path as dstrain.

    Loader(path, split="train", fields=None, as_tuple=False, batch=256,
           order="chunk", seed=0, placement=None, device=None,
           drop_last=True, prefetch=None, readers=None, chunk=None, window=8,
           direct=None, host_mem=None, bench=None, convert=True,
           normalize=True, mean=None, std=None, keep=2,
           managed_policy="prefetch", oversubscribe=False, epoch=0,
           output="arrays", labels=None, weights=None)

    Each iteration over the loader yields the remaining batches of the current
    epoch, then moves to the next epoch; ``len(loader)`` is the number of
    batches in an epoch.

    fields: the split's fields each batch holds, any dtype and per-sample
    shape, every one the same samples in the same order (one copy per field
    per batch). With ``fields=[...]`` each batch is a dict {name: array}
    (a tuple in the order given with ``as_tuple=True``). Without fields, the
    manifest's input and label roles, yielded as the tuple ``(x, y)``; a
    dataset without a label role then needs ``fields``.

    Each field is converted by its kind, in one conversion step (on the GPU
    for GPU batches): the input role normalised to float32, ``(x - mean[c]) /
    std[c]`` per channel, with the manifest's statistics, else ones computed
    from a scan of the training split (as dstrain does; ``mean``/``std`` give
    your own, ``normalize=False`` plain float32); an integer label role as
    classes, int32, or int64 with ``labels="int64"`` (the default with
    ``output="torch"``: what PyTorch's losses take); every other field as
    float32. ``convert=False`` keeps every field as stored (bf16 as its raw
    uint16 bits; an integer label role is still widened with
    ``labels="int64"``); a dict sets single fields: ``convert={"moves": "int64",
    "positions": False}`` (False or "stored", True for the default, "float32",
    "int32", "int64", "normalised").

    The plan: placement, chunk, readers, prefetch, O_DIRECT and the memory
    ceilings are decided by the library's one planning entrance, the one
    dstrain, dsbench and dsplan use (``loader.plan``, ``loader.describe()``):

    - placement "stream" (default): reader threads read whole chunks into a
      window cache and gather batches into a ring of ``prefetch`` host slots
      (pinned), a copy stream moves them to the GPU. Host and GPU memory stay
      at ``host_bytes`` / ``device_bytes``, counting every field, whatever the
      dataset size. "device": the whole split in GPU memory; "managed": in CUDA
      managed memory with prefetching (``managed_policy``; ``oversubscribe``);
      "auto": device where the split fits, else stream; "host": the cpu
      backend's stream source (NumPy batches).
    - device: None picks cuda:0 where a GPU answers, else the CPU with a
      notice (a RuntimeWarning): batches are then NumPy arrays converted on the
      CPU. "cpu" asks for the CPU; "cuda:N" for that GPU (an error without one).
    - chunk (chunk order: samples per chunk; a zstd-chunked field's own chunk
      wins), prefetch, readers, direct (O_DIRECT reads, bypassing the page
      cache) and host_mem (bytes for the ring and window cache): None lets
      the plan decide, as dstrain does (O_DIRECT where the split does not fit
      in memory beside the stream; ``bench``, a dsbench --json file, tunes
      readers and prefetch).

    order: "sequential", "chunk" (chunk order shuffled, samples mixed within a
    window of ``window`` chunks) or "full" (one permutation per epoch). The
    order is a pure function of (seed, epoch): ``dstk.order_indices(samples,
    epoch, order, seed, loader.chunk, window)`` gives it.

    output="arrays" (default): GPU batches are DeviceArray objects (DLPack:
    ``torch.from_dlpack(x)``, CuPy, JAX), CPU batches NumPy arrays.
    output="torch": torch.Tensor batches (PyTorch must be installed). On the
    GPU each slot's fields are wrapped in tensors once and those tensors are
    handed out again whenever their slot holds the batch, after the current
    torch stream has been made to wait for the batch: the cheapest hand-off to
    a training step whose CPU time matters (a compiled step). On the CPU,
    ``torch.from_numpy`` of the NumPy batch.

    Batch lifetime (GPU): batches live in ``keep + 3`` device slots; a
    consumer may hold the newest batch and ``keep`` before it. Batch n stays
    valid until batch n + keep + 1 is taken, and work enqueued on the
    consumer's stream before then finishes before its memory is overwritten.
    To keep a batch longer, copy it (``torch.from_dlpack(x).clone()``; with
    output="torch", ``x.clone()``: the tensor object itself comes back for a
    later batch). NumPy batches are fresh arrays the caller owns.

    A mix: ``path`` a list of two or more datasets with the same fields
    trains them as one. Each batch draws from every member in proportion to
    ``weights`` (one per member; default their sizes: every sample once per
    epoch); an epoch ends when the member with the largest weight-to-size
    ratio has been seen once, and no member repeats a sample within it. The
    fields ``"dataset"`` (int32, the member's index in ``path``) and
    ``"index"`` (int64, the sample's row in that member's split) may be named
    in ``fields``; they stay as stored. ``placement`` is then one of "auto"
    (the default), "device", "host" (kept in the page cache) or "stream" for
    every member, or a list with one per member; "auto" keeps in memory the
    members drawn most for their size, within ``host_mem`` (the whole mix's
    budget, default half of the available memory). ``loader.plan["mix"]``
    holds the mix's plan, ``loader.describe()`` one line per member. Input
    statistics are the members' combined by their draws per epoch.

    Resume: ``state_dict()`` holds (epoch, next batch, seed, order, batch,
    split, chunk, window; a mix's members and their draws per epoch); ``load_state_dict(sd)``
    on a loader of the same dataset and settings continues with exactly the
    batch that would have come next, and raises ValueError where a setting
    differs.

    Threads and processes: one loader delivers one sequence of batches to one
    thread at a time (a second thread iterating it meanwhile gets dstk.Error;
    give each thread a Loader). An iteration abandoned when another one
    started raises RuntimeError if resumed. In a process forked from the one
    that made it (multiprocessing's fork, a DataLoader's workers), a CPU
    loader starts reader threads of its own at its first iteration there,
    from the epoch and batch where it stood at the fork; a GPU loader cannot
    (CUDA does not survive fork()): make it in the child, or use 'spawn'.

    GPU batches are converted by a feeder thread in the library, up to two
    batches before they are taken, so that taking one costs the consumer's
    thread little CPU (a compiled PyTorch step is often bound by the CPU).

    ``times`` holds the seconds per stage summed over the batches of the
    current (or, between epochs, the last) epoch taken so far (read_wait: the
    consumer waiting for a batch; read, decode: reader threads; h2d: copies),
    with batch, sample and byte counts (on the GPU these count the batches
    the feeder took, up to two more than the consumer mid-epoch).

    Errors raise dstk.Error with the library's message (bad path, corrupt
    chunk named by file and chunk, bad settings). Ctrl-C raises
    KeyboardInterrupt from the loop; the loader stays at the batch after the
    last one yielded, and a new ``for batch in loader`` continues from there.

    Ctrl-C during a read that does not return (a hung network filesystem, a
    disk that stopped answering): while the loader waits for a batch, or for
    its reader threads when an iteration starts, it runs Python's signal
    handlers every 0.05 s, so KeyboardInterrupt (or what any handler raises)
    comes at once. So do ``Loader(...)`` while it reads the split into memory
    (placement "device" or "managed"; the read is given up at its next piece
    of 64 MiB, or when a stuck read returns) and ``loader.times``. The threads stuck in the read cannot be stopped: a new
    iteration waits for them (interruptible too) and goes on with the right
    batches once the read returns; deleting the loader waits for them (it
    joins its threads); at interpreter exit the loader gives them a second,
    then leaves them to the process's exit, which ends them, unless the kernel
    holds the read in an uninterruptible wait (a hard NFS mount's "D" state):
    then the exit, too, waits for it.
    """

    def __init__(self, path, split="train", fields=None, as_tuple=False, batch=256, order="chunk", seed=0,
                 placement=None, device=None, drop_last=True, prefetch=None, readers=None, chunk=None,
                 window=8, direct=None, host_mem=None, bench=None, convert=True, normalize=True, mean=None,
                 std=None, keep=2, managed_policy="prefetch", oversubscribe=False, epoch=0, output="arrays",
                 labels=None, weights=None):
        if output not in ("arrays", "torch"):
            raise ValueError(f"invalid output={output!r} (expected 'arrays' or 'torch')")
        if labels is None:
            labels = "int64" if output == "torch" else "int32"
        if labels not in ("int32", "int64"):
            raise ValueError(f"invalid labels={labels!r} (expected 'int32' or 'int64')")
        if fields is not None and (isinstance(fields, str) or not all(isinstance(f, str) for f in fields)):
            raise ValueError(f"fields={fields!r} must be a list of field names, e.g. fields=['x', 'y']")
        self._torch = None
        if output == "torch":
            try:
                import torch
            except ImportError as e:
                raise ImportError("dstk.Loader(output='torch') needs PyTorch (pip install torch); "
                                  "output='arrays' gives DLPack (GPU) or NumPy (CPU) batches") from e
            self._torch = torch
        if not normalize and (mean is not None or std is not None):
            raise ValueError("mean/std given with normalize=False (they would be ignored); drop one")
        a = _dstk._LoaderArgs()
        paths = [path] if isinstance(path, (str, bytes, os.PathLike)) else list(path)
        if not paths:
            raise ValueError("path=[] names no dataset; give a dataset directory or a list of them (a mix)")
        a.paths = [os.fsdecode(p) for p in paths]
        mix = len(paths) > 1
        if placement is None:
            placement = "auto" if mix else "stream"
        if not isinstance(placement, str):
            a.placements, placement = [str(p) for p in placement], "auto"
        elif mix:
            a.placements = [placement]
        a.weights = [] if weights is None else [float(w) for w in weights]
        a.split, a.order = _text("split", split), _text("order", order)
        a.placement, a.managed_policy = _text("placement", placement), _text("managed_policy", managed_policy)
        a.device = "" if device is None else str(device)
        a.fields = [] if fields is None else list(fields)
        a.batch, a.seed = _whole("batch", batch, 0, 2**32 - 1), _whole("seed", seed)  # 0: the library says why
        a.window = _whole("window", window, 1)
        a.chunk, a.host_mem = _optional("chunk", chunk), _optional("host_mem", host_mem)
        a.prefetch, a.readers = _optional("prefetch", prefetch), _optional("readers", readers)
        a.direct = -1 if direct is None else int(bool(direct))
        a.bench = "" if bench is None else os.fsdecode(bench)
        a.drop_last, a.oversubscribe = bool(drop_last), bool(oversubscribe)
        a.keep = _whole("keep", keep, 0, 2**32 - 1)
        self._set_convert(a, convert)
        a.labels64 = labels == "int64"
        a.normalize = bool(normalize)
        a.mean = [] if mean is None else _finite("mean", mean)
        a.std = [] if std is None else _finite("std", std, positive=True)
        epoch = _whole("epoch", epoch)
        self._impl = _dstk._Loader(a)
        self._say()
        self.split, self.batch, self.order, self.seed = split, a.batch, order, a.seed
        self._mix = None
        if mix:  # what a mix's order depends on beside the seed: its members and their draws per epoch
            self._mix = {"paths": [os.path.abspath(p) for p in a.paths],
                         "quotas": [m["quota"] for m in self.plan["mix"]["members"]]}
        self.epoch, self.next_batch = epoch, 0
        self._iteration = 0  # counts iterations started: an abandoned one may not resume
        self.output, self.labels = output, labels
        self._names = [f[0] for f in self._impl.fields]
        self._shape = None if fields is None else ("tuple" if as_tuple else "dict")
        self._times = {}
        self._slot_tensors = {}  # output="torch" on the GPU: (slot, size) -> tensors over it

    @staticmethod
    def _set_convert(a, convert):
        if isinstance(convert, dict):
            a.convert = True
            kinds = {}
            for name, kind in convert.items():
                if kind not in _KINDS:
                    raise ValueError(f"invalid convert[{name!r}]={kind!r} (expected True, False, 'stored', "
                                     "'float32', 'int32', 'int64' or 'normalised')")
                if _KINDS[kind] is not None:
                    kinds[str(name)] = _KINDS[kind]
            a.kinds = kinds
        else:
            a.convert = bool(convert)

    def _say(self):
        """Shows the library's notices (no GPU, O_DIRECT refused) as RuntimeWarnings."""
        for line in self._impl.take_messages():
            warnings.warn(f"dstk.Loader: {line}", RuntimeWarning, stacklevel=3)

    @property
    def times(self):
        """Seconds per stage and counts, summed over this epoch's batches so far (see the class doc)."""
        self._collect_times()
        return dict(self._times)

    def _collect_times(self):
        for k, v in self._impl.take_times().items():
            self._times[k] = self._times.get(k, 0) + v

    def __len__(self):
        return self._impl.batches_per_epoch

    @property
    def samples(self):
        """Samples in the split."""
        return self._impl.samples

    @property
    def on_gpu(self):
        """True when batches are DeviceArray objects in GPU memory (else NumPy arrays)."""
        return self._impl.on_gpu

    @property
    def device_bytes(self):
        """Backend memory the loader holds at most, every field counted: the GPU's for cuda (slots, or the split)."""
        return self._impl.device_bytes

    @property
    def host_bytes(self):
        """Host memory the data path holds at most, every field counted: ring slots, window cache, buffers;
        without a GPU also ``keep`` + 1 converted batches (the arrays a loop holds, which are the caller's)."""
        return self._impl.host_bytes

    @property
    def plan(self):
        """The data path's plan as a dict (dsplan --json's "data_path"): placement, chunk, readers, ceilings, why."""
        return json.loads(self._impl.plan_json)

    def describe(self):
        """The plan in the lines dstrain, dsbench and dsplan print for the same dataset and settings."""
        return list(self._impl.plan_lines)

    @property
    def placement(self):
        return self.plan["placement"]

    @property
    def device(self):
        return self.plan["device"]

    @property
    def chunk(self):
        """Samples per chunk of the order (what dstk.order_indices takes as chunk)."""
        return self.plan["chunk_samples"]

    @property
    def fields(self):
        """The delivered fields, in batch order: {name: {"dtype", "shape", "kind", "stored"}} (dtype and the
        stored dtype as dstk names them: "f32", "u8", ...; kind: how it was converted)."""
        return {f[0]: {"dtype": f[5], "shape": tuple(f[2]), "kind": f[3], "stored": f[4]} for f in self._impl.fields}

    @property
    def dtype(self):
        """Name of the first field's dtype in the batches ("f32" when converting, else the stored one)."""
        return self._impl.fields[0][5]

    @property
    def mean(self):
        """The normalised input's per-channel mean, in stored units (None when nothing is normalised)."""
        norms = list(self._impl.norms.values())
        return list(norms[0][0]) if norms else None

    @property
    def std(self):
        """The normalised input's per-channel standard deviation, in stored units."""
        norms = list(self._impl.norms.values())
        return list(norms[0][1]) if norms else None

    def _device_arrays(self, slot, size):
        arrays = self._impl.slot_arrays(slot, size)
        return [DeviceArray(a, self._impl, slot, (size,) + tuple(f[2]), f[1])
                for a, f in zip(arrays, self._impl.fields)]

    def _arrange(self, arrays):
        """A batch's arrays as the loader yields them: (x, y), a dict, or a tuple."""
        if self._shape == "dict":
            return dict(zip(self._names, arrays))
        return tuple(arrays)

    def _taker(self):
        """A function that takes the next batch's arrays in this loader's output form (None at the epoch's end)."""
        impl, torch = self._impl, self._torch
        if not self.on_gpu:
            if torch is None:
                return impl.next
            return lambda: (lambda b: b and tuple(torch.from_numpy(a) for a in b))(impl.next())
        if torch is None:
            return lambda: (lambda b: b and self._device_arrays(*b))(impl.next())
        device, views, current = torch.device(self.device), self._slot_tensors, torch.cuda.current_stream

        def take():
            b = impl.next(current(device).cuda_stream)  # that stream waits for the batch
            if b is None:
                return None
            v = views.get(b)
            if v is None:  # a slot not seen yet, or the epoch's short last batch
                v = views[b] = tuple(torch.from_dlpack(a) for a in self._device_arrays(*b))
            return v

        return take

    def __iter__(self):
        self._impl.start_epoch(self.epoch, self.next_batch)  # drops what an abandoned iteration counted
        self._iteration += 1
        mine = self._iteration
        self._times = {}
        take, arrange = self._taker(), self._arrange
        while True:
            if self._iteration != mine:
                raise RuntimeError("dstk.Loader: this iteration was abandoned when another one started (each "
                                   "iteration continues where the last one stopped); use the newer iteration")
            batch = take()
            if batch is None:
                break
            self.next_batch += 1
            yield arrange(batch)
        self._collect_times()  # the epoch's last figures, before the next epoch starts
        self._say()
        self.epoch += 1
        self.next_batch = 0

    def set_epoch(self, epoch):
        """Starts the next iteration at the first batch of ``epoch``."""
        self.epoch, self.next_batch = _whole("epoch", epoch), 0

    def state_dict(self):
        """Where the loader stands: the next iteration yields batch ``batch`` of epoch ``epoch``; with the
        settings the order depends on (seed, order, chunk, window; a mix's members and their quotas)."""
        state = {"epoch": self.epoch, "batch": self.next_batch, "seed": self.seed, "order": self.order,
                 "batch_size": self.batch, "split": self.split, "samples": self.samples, "fields": self._names,
                 "chunk": self.chunk, "window": self._window()}
        if self._mix:
            state["mix"] = self._mix
        return state

    def _window(self):
        return self.plan.get("window_chunks", 0)

    def load_state_dict(self, state):
        """Continues where ``state`` (from state_dict) stood; raises ValueError when the settings differ
        (a state from an older dstk, without chunk, window or mix, is checked on what it holds)."""
        mine = self.state_dict()
        for key in ("seed", "order", "batch_size", "split", "samples", "fields", "chunk", "window", "mix"):
            if key in state and state[key] != mine.get(key):
                raise ValueError(f"state_dict has {key}={state[key]!r} but this loader has {mine.get(key)!r} "
                                 "(the batches would differ); build the loader with the same settings")
        if not 0 <= state["batch"] <= len(self):
            raise ValueError(f"state_dict batch {state['batch']} is outside the epoch's {len(self)} batches")
        self.epoch, self.next_batch = int(state["epoch"]), int(state["batch"])

    def __repr__(self):
        return (f"dstk.Loader(split={self.split!r}, fields={self._names}, batch={self.batch}, "
                f"order={self.order!r}, placement={self.placement!r}, device={self.device!r}, "
                f"epoch={self.epoch}, next_batch={self.next_batch}/{len(self)})")
