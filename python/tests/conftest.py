"""Datasets made with the built dsgen and dsconvert (DSTK_BIN, default build/bin)."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("DSTK_BIN", ROOT / "build" / "bin"))


def tool(name, *args):
    exe = BIN / name
    if not exe.exists():
        raise FileNotFoundError(f"{exe} is missing (build the tools first, or set DSTK_BIN)")
    subprocess.run([str(exe), *map(str, args)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_dataset(tmp, name, arrays, *convert_args):
    """arrays: npz member name -> array; returns the dataset directory made by dsconvert."""
    npz = tmp / f"{name}.npz"
    np.savez(npz, **arrays)
    out = tmp / name
    tool("dsconvert", npz, out, "-q", *convert_args)
    return out


N = 1000  # samples of the index datasets


@pytest.fixture(scope="session")
def index_sets(tmp_path_factory):
    """y = sample index: the loader's labels are the positions the order visited.
    {"npy": dir, "zstd": dir (chunks of 64 samples)}."""
    tmp = tmp_path_factory.mktemp("index")
    x = (np.arange(N * 12, dtype=np.uint32) % 251).astype(np.uint8).reshape(N, 3, 2, 2)
    arrays = {"x_train": x, "y_train": np.arange(N, dtype=np.int32)}
    return {"npy": make_dataset(tmp, "npy", arrays),
            "zstd": make_dataset(tmp, "zstd", arrays, "--compress", "zstd", "--chunk-samples", 64)}


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    """A small dsgen image dataset (u8 3x8x8, per-channel stats in its manifest)."""
    out = tmp_path_factory.mktemp("gen") / "images"
    tool("dsgen", out, "--train", 600, "--test", 100, "--shape", "3x8x8", "-q", "-T", 1)
    return out


def gpu_ready():
    """Whether the GPU tests can run: a CUDA GPU, PyTorch with CUDA, and dstk built with CUDA."""
    try:
        import torch
    except ImportError:
        return False
    import dstk
    return dstk.built_with_cuda and torch.cuda.is_available()
