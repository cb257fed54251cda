"""Chess-shaped training data for the loader benchmarks (issue 24's seeds): a
folder of .npy files of equal length, written in pieces (memory stays at one
piece whatever the size), and its dataset made by dsconvert:

  positions  int8 (N, 12, 8, 8)  twelve piece planes
  moves      int32 (N,)          the policy target, in [0, 4672)
  results    int8 (N,)           the value target, in {-1, 0, 1}

The values are random but learnable: the move is a function of the first
plane and the result of the piece balance, so a two-head model's losses fall.
"""
import os
import subprocess

import numpy as np

MOVES = 4672
ROW_BYTES = 12 * 8 * 8 + 4 + 1


def write_npy_folder(folder, n, seed=0, piece=1 << 16):
    """positions.npy, moves.npy and results.npy of `n` samples in `folder`."""
    os.makedirs(folder, exist_ok=True)
    pos = np.lib.format.open_memmap(os.path.join(folder, "positions.npy"), "w+", np.int8, (n, 12, 8, 8))
    mov = np.lib.format.open_memmap(os.path.join(folder, "moves.npy"), "w+", np.int32, (n,))
    res = np.lib.format.open_memmap(os.path.join(folder, "results.npy"), "w+", np.int8, (n,))
    rng = np.random.default_rng(seed)
    weights = rng.integers(0, MOVES, 64)
    for first in range(0, n, piece):
        k = min(piece, n - first)
        p = (rng.random((k, 12, 8, 8)) < 0.08).astype(np.int8)
        pos[first:first + k] = p
        mov[first:first + k] = (p[:, 0].reshape(k, 64) @ weights) % MOVES
        balance = p[:, :6].sum(axis=(1, 2, 3)).astype(np.int64) - p[:, 6:].sum(axis=(1, 2, 3))
        res[first:first + k] = np.sign(balance).astype(np.int8)
    for a in (pos, mov, res):
        a.flush()
    del pos, mov, res


def make_dataset(dsconvert, folder, out, *extra):
    """The dataset dsconvert imports from the folder: names kept, positions the
    input and moves the label; `extra` more dsconvert options."""
    subprocess.run([dsconvert, folder, out, "--input", "positions", "--label", "moves", "--force", "-q", *extra],
                   check=True)
    return out


def chess_dataset(dsconvert, work, n, seed=0, keep_source=False):
    """A chess dataset of `n` positions under `work`: the dataset's path."""
    src = os.path.join(work, "chess-npy")
    write_npy_folder(src, n, seed)
    out = make_dataset(dsconvert, src, os.path.join(work, "chess"))
    if not keep_source:
        for f in os.listdir(src):
            os.remove(os.path.join(src, f))
        os.rmdir(src)
    return out
