"""dstk from Python: the same core library as dsgen, dsconvert and dstrain.

- ``dstk.open(path)``: a dataset's splits, fields, dtypes, shapes and manifest;
  any field as a NumPy array (memory-mapped ``.npy`` storage, zstd-chunked
  storage decoded chunk by chunk), bf16/f16 widened on request.
- ``dstk.Loader(path, ...)``: (x, y) batches from dstrain's batch sources
  (reader threads, ring, copy stream; stream, device, managed or host
  placement) in dstrain's orders, converted and normalised on the GPU and
  handed over through DLPack (``torch.from_dlpack``, CuPy, JAX); NumPy arrays
  without a GPU. Exact mid-epoch resume with ``state_dict()``.
- ``dstk.order_indices(...)``: the sample order of one epoch.
- ``dstk.host_memory()``: host memory as the loader plans it.
- ``dstk.Error``: every library error (a RuntimeError with ``exit_code``).
"""
from ._dstk import Error, built_with_cuda, host_memory, order_indices, __version__
from .dataset import Dataset, Field, Split, open
from .loader import DeviceArray, Loader

__all__ = ["Dataset", "DeviceArray", "Error", "Field", "Loader", "Split", "built_with_cuda", "host_memory", "open",
           "order_indices", "__version__"]
