"""The README tour's Python example runs (on the CPU without a GPU: NumPy batches)."""
import re
import types

import numpy as np

import dstk
from conftest import ROOT


def tour_snippet():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Python: `dstk.open`"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def chess_snippet():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Python: `dstk.open`"):]
    return re.findall(r"```python\n(.*?)```", section, re.S)[1]


def test_readme_chess_loop_runs(tmp_path):
    from conftest import make_dataset
    r = np.random.default_rng(3)
    n = 512
    arrays = {"positions": r.integers(-1, 2, (n, 12, 8, 8)).astype(np.int8),
              "moves": r.integers(0, 4672, n).astype(np.int32), "results": r.integers(-1, 2, n).astype(np.int8)}
    chess = make_dataset(tmp_path, "chess", arrays, "--input", "positions", "--label", "moves")
    code = chess_snippet().replace('"chess/"', repr(str(chess))).replace('output="torch"', 'placement="host"')
    seen = []

    def model(x):
        seen.append(x.shape)
        return np.zeros((len(x), 4672), np.float32), np.zeros(len(x), np.float32)

    loss = types.SimpleNamespace(cross_entropy=lambda p, y: float(len(y)), mse_loss=lambda v, r: 0.0)
    exec(compile(code, "README.md", "exec"), {"dstk": dstk, "model": model, "F": loss, "print": lambda *a: None})
    assert seen == [(256, 12, 8, 8)] * 2


def test_readme_tour_runs(images, tmp_path, monkeypatch):
    from conftest import tool
    big = tmp_path / "big"  # the mix's second member: the shape of images, other samples
    tool("dsgen", big, "--train", 300, "--test", 50, "--shape", "3x8x8", "--seed", 2, "-q", "-T", 1)
    code = tour_snippet().replace('"data/"', repr(str(images))).replace('"big/"', repr(str(big)))
    code = code.replace("batch=256", "batch=64").replace("[1000:1256]", "[100:356]")
    try:
        import torch
        gpu = dstk.built_with_cuda and torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:  # NumPy batches: from_dlpack of a NumPy array is the array
        code = code.replace("import dstk, torch", "import dstk")
        code = code.replace('device="cuda:0"', 'device="cpu"')
        scope = {"torch": types.SimpleNamespace(from_dlpack=np.asarray)}
    else:
        scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["x"].shape == (256, 3, 8, 8)
    assert scope["state"]["epoch"] == 1 and scope["state"]["batch"] == 0
    assert [m["quota"] for m in scope["mix"].plan["mix"]["members"]] == [600, 300]
