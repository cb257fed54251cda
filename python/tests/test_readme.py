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


def test_readme_tour_runs(images, monkeypatch):
    code = tour_snippet().replace('"data/"', repr(str(images))).replace("batch=256", "batch=64").replace("[1000:1256]", "[100:356]")
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
