"""dstk.Loader: dstrain's data path as a Python iterable of batches."""
import os

from . import _dstk


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


class Loader:
    """Batches (x, y) of one split, from the same C++ data path as dstrain.

    Loader(path, split="train", batch=256, order="chunk", seed=0,
           placement="stream", device="cuda:0", drop_last=True, prefetch=4,
           readers=2, chunk=4096, window=8, direct=False, convert=True,
           normalize=True, mean=None, std=None, keep=2,
           managed_policy="prefetch", oversubscribe=False, epoch=0,
           output="arrays", labels=None)

    Each iteration over the loader yields the remaining batches of the current
    epoch, then moves to the next epoch; ``len(loader)`` is the number of
    batches in an epoch. Batches come from the library's BatchSource:

    - placement "stream": reader threads read whole chunks into a ring of
      ``prefetch`` host slots (pinned), a copy stream moves them to the GPU.
      Host and GPU memory stay at ``host_bytes`` / ``device_bytes`` whatever
      the dataset size. ``direct=True`` reads the input with O_DIRECT (.npy
      chunks, and each compressed frame of zstd-chunked storage), bypassing
      the page cache: for data larger than RAM, where buffered reads under
      memory pressure fall short of the disk (dstrain --direct).
    - "device": the whole split in GPU memory; "managed": in CUDA managed
      memory with prefetching (``managed_policy``; ``oversubscribe`` to allow
      a split larger than free GPU memory).
    - "host": the stream source of the cpu backend; NumPy batches.
    - device="cpu" (or a build without CUDA): "stream" and "device" run on the
      cpu backend and yield NumPy batches.

    order: "sequential", "chunk" (chunk order shuffled, samples mixed within a
    window of ``window`` chunks of ``chunk`` samples; a zstd-chunked field uses
    its own chunk) or "full" (one permutation per epoch). The order is a pure
    function of (seed, epoch): ``dstk.order_indices`` gives it.

    x: with convert=True (default) float32 of shape (n, *sample_shape) with
    (x - mean[c]) / std[c] per channel, computed on the GPU by dstrain's
    conversion kernel (on the CPU for NumPy batches); mean and std in stored
    units, by default the manifest's stats; normalize=False gives plain float.
    The input must then be u8, bf16, f16 or f32. convert=False gives the stored
    values (bf16 as raw uint16 bits). y: labels, shape (n,), int32 as stored or,
    with labels="int64", widened (on the GPU for GPU batches): what PyTorch's
    losses take. labels=None means int64 for output="torch", else int32.

    output="arrays" (default): GPU batches are DeviceArray objects (DLPack:
    ``torch.from_dlpack(x)``, CuPy, JAX), CPU batches NumPy arrays.
    output="torch": torch.Tensor batches (PyTorch must be installed). On the
    GPU each of the ``keep + 3`` slots is wrapped in a tensor once and that
    tensor is handed out again whenever its slot holds the batch, after the
    current torch stream has been made to wait for the batch: the cheapest
    hand-off to a training step whose CPU time matters (a compiled step). On
    the CPU, ``torch.from_numpy`` of the NumPy batch.

    Batch lifetime (GPU): batches live in ``keep + 3`` device slots; a
    consumer may hold the newest batch and ``keep`` before it. Batch n stays
    valid until batch n + keep + 1 is taken, and work enqueued on the
    consumer's stream before then finishes before its memory is overwritten.
    To keep a batch longer, copy it (``torch.from_dlpack(x).clone()``; with
    output="torch", ``x.clone()``: the tensor object itself comes back for a
    later batch). NumPy batches are fresh arrays the caller owns.

    Resume: ``state_dict()`` holds (epoch, next batch, seed, order, batch,
    split); ``load_state_dict(sd)`` on a loader of the same dataset and
    settings continues with exactly the batch that would have come next.

    GPU batches are converted by a feeder thread in the library, up to two
    batches before they are taken, so that taking one costs the consumer's
    thread little CPU (a compiled PyTorch step is often bound by the CPU).

    ``times`` holds the seconds per stage summed over the batches of the
    current (or, between epochs, the last) epoch taken so far (read_wait: the
    consumer waiting for a batch; read, decode: reader threads; h2d: copies),
    with batch, sample and byte counts (on the GPU these count the batches
    the feeder took, up to two more than the consumer mid-epoch);
    ``device_bytes`` and ``host_bytes`` are the memory ceilings (GPU slots or
    the resident split; ring, reader buffers and decoded chunks).

    Errors raise dstk.Error with the library's message (bad path, corrupt
    chunk named by file and chunk, bad settings). Ctrl-C raises
    KeyboardInterrupt from the loop; the loader stays at the batch after the
    last one yielded.
    """

    def __init__(self, path, split="train", batch=256, order="chunk", seed=0, placement="stream",
                 device="cuda:0", drop_last=True, prefetch=4, readers=2, chunk=4096, window=8, direct=False,
                 convert=True, normalize=True, mean=None, std=None, keep=2, managed_policy="prefetch",
                 oversubscribe=False, epoch=0, output="arrays", labels=None):
        if output not in ("arrays", "torch"):
            raise ValueError(f"invalid output={output!r} (expected 'arrays' or 'torch')")
        if labels is None:
            labels = "int64" if output == "torch" else "int32"
        if labels not in ("int32", "int64"):
            raise ValueError(f"invalid labels={labels!r} (expected 'int32' or 'int64')")
        self._torch = None
        if output == "torch":
            try:
                import torch
            except ImportError as e:
                raise ImportError("dstk.Loader(output='torch') needs PyTorch (pip install torch); "
                                  "output='arrays' gives DLPack (GPU) or NumPy (CPU) batches") from e
            self._torch = torch
        if not _dstk.built_with_cuda and placement in ("stream", "device") and str(device).startswith("cuda"):
            device = "cpu"  # documented: without CUDA the cpu backend serves stream and device
        a = _dstk._LoaderArgs()
        a.path = os.fspath(path)
        a.split, a.placement, a.device, a.order = split, placement, str(device), order
        a.managed_policy = managed_policy
        a.batch, a.seed, a.chunk, a.window = int(batch), int(seed), int(chunk), int(window)
        a.drop_last, a.direct, a.convert, a.oversubscribe = bool(drop_last), bool(direct), bool(convert), \
            bool(oversubscribe)
        a.prefetch, a.readers, a.keep = int(prefetch), int(readers), int(keep)
        a.labels64 = labels == "int64"
        if not normalize and (mean is not None or std is not None):
            raise ValueError("mean/std given with normalize=False (they would be ignored); drop one")
        a.normalize = bool(normalize)
        a.mean = [] if mean is None else [float(v) for v in mean]
        a.std = [] if std is None else [float(v) for v in std]
        self._impl = _dstk._Loader(a)
        self.split, self.batch, self.order, self.seed = split, int(batch), order, int(seed)
        self.epoch, self.next_batch = int(epoch), 0
        self.output, self.labels = output, labels
        self._times = {}
        self._slot_tensors = {}  # output="torch" on the GPU: slot -> (x, y) tensors over it

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
        """Backend memory the loader holds at most: the GPU's for cuda (slots, or the resident split)."""
        return self._impl.device_bytes

    @property
    def host_bytes(self):
        """Host memory the loader holds at most: ring slots, reader buffers, decoded chunks."""
        return self._impl.host_bytes

    @property
    def placement(self):
        return self._impl.placement

    @property
    def device(self):
        return self._impl.device

    @property
    def dtype(self):
        """Name of x's dtype in the batches ("f32" when converting, else the stored one)."""
        return self._impl.dtype

    @property
    def mean(self):
        return self._impl.mean

    @property
    def std(self):
        return self._impl.std

    def _device_arrays(self, slot, size):
        x, y, shape, xdtype, ydtype = self._impl.slot_arrays(slot, size)
        return DeviceArray(x, self._impl, slot, shape, xdtype), DeviceArray(y, self._impl, slot, (size,), ydtype)

    def _taker(self):
        """A function that takes the next batch in this loader's output form (None at the epoch's end)."""
        impl, torch = self._impl, self._torch
        if not self.on_gpu:
            if torch is None:
                return impl.next
            return lambda: (lambda b: b and (torch.from_numpy(b[0]), torch.from_numpy(b[1])))(impl.next())
        if torch is None:
            return lambda: (lambda b: b and self._device_arrays(*b))(impl.next())
        device, views, current = torch.device(self.device), self._slot_tensors, torch.cuda.current_stream

        def take():
            b = impl.next(current(device).cuda_stream)  # that stream waits for the batch
            if b is None:
                return None
            v = views.get(b)
            if v is None:  # a slot not seen yet, or the epoch's short last batch
                x, y = self._device_arrays(*b)
                v = views[b] = (torch.from_dlpack(x), torch.from_dlpack(y))
            return v

        return take

    def __iter__(self):
        self._impl.start_epoch(self.epoch, self.next_batch)  # drops what an abandoned iteration counted
        self._times = {}
        take = self._taker()
        while True:
            batch = take()
            if batch is None:
                break
            self.next_batch += 1
            yield batch
        self._collect_times()  # the epoch's last figures, before the next epoch starts
        self.epoch += 1
        self.next_batch = 0

    def set_epoch(self, epoch):
        """Starts the next iteration at the first batch of ``epoch``."""
        self.epoch, self.next_batch = int(epoch), 0

    def state_dict(self):
        """Where the loader stands: the next iteration yields batch ``batch`` of epoch ``epoch``."""
        return {"epoch": self.epoch, "batch": self.next_batch, "seed": self.seed, "order": self.order,
                "batch_size": self.batch, "split": self.split, "samples": self.samples}

    def load_state_dict(self, state):
        """Continues where ``state`` (from state_dict) stood; raises ValueError when the settings differ."""
        mine = self.state_dict()
        for key in ("seed", "order", "batch_size", "split", "samples"):
            if state[key] != mine[key]:
                raise ValueError(f"state_dict has {key}={state[key]!r} but this loader has {mine[key]!r} "
                                 "(the batches would differ); build the loader with the same settings")
        if not 0 <= state["batch"] <= len(self):
            raise ValueError(f"state_dict batch {state['batch']} is outside the epoch's {len(self)} batches")
        self.epoch, self.next_batch = int(state["epoch"]), int(state["batch"])

    def __repr__(self):
        return (f"dstk.Loader(split={self.split!r}, batch={self.batch}, order={self.order!r}, "
                f"placement={self.placement!r}, device={self.device!r}, epoch={self.epoch}, "
                f"next_batch={self.next_batch}/{len(self)})")

