"""The extension loads no library PyTorch bundles under the same name (cuDNN,
cuBLAS): a process that imported dstk first would hand PyTorch ours, and
`import dstk; import torch` aborted in free() on the GPU machine."""
import os
import shutil
import subprocess
import sys

import pytest

import dstk


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
def test_the_extension_needs_neither_cudnn_nor_cublas():
    libs = needed(dstk._dstk.__file__)
    assert libs, "readelf found no NEEDED entries"
    for lib in libs:
        assert not lib.startswith(("libcudnn", "libcublas", "libnccl")), f"{lib} in {libs}"


def test_torch_imports_after_dstk():
    pytest.importorskip("torch")
    code = ("import dstk, torch; x = torch.ones(3); "
            "print('cuda' if torch.cuda.is_available() and bool((x.cuda() + 1).sum() == 6) else 'cpu')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() in ("cuda", "cpu")
