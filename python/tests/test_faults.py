"""Hostile inputs from Python (issue 27): the module's init makes closed
stdin/stderr valid, and a deep manifest, unusable statistics or a FIFO in a
dataset are dstk.Error, never a crash or a hang."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import dstk


def run_python(code, timeout=60, **kwargs):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, **kwargs)


def test_import_opens_closed_standard_fds_on_dev_null():
    # With stdin and stderr closed, the first file opened after the import
    # must not take descriptor 0 or 2 (the library's warnings go to 2).
    code = "import os, dstk; print(os.open(os.devnull, os.O_RDONLY)); print(os.path.realpath('/proc/self/fd/2'))"
    r = run_python(code, preexec_fn=lambda: (os.close(0), os.close(2)))
    assert r.returncode == 0, r
    fd, stderr_target = r.stdout.split()
    assert int(fd) > 2
    assert stderr_target == os.devnull


def copy_with_manifest(src, dst, change):
    shutil.copytree(src, dst)
    path = dst / "dataset.json"
    text = change(path.read_text())
    path.write_text(text)
    return dst


def test_deep_manifest_is_an_error(images, tmp_path):
    deep = "[" * 100000 + "]" * 100000
    ds = copy_with_manifest(images, tmp_path / "deep", lambda t: t.replace('"params": {', '"params": {"d": ' + deep + ", ", 1))
    with pytest.raises(dstk.Error, match="nested more than 64 deep") as e:
        dstk.open(ds)
    assert e.value.exit_code == 1


def test_unusable_stats_are_an_error(images, tmp_path):
    def std0(text):
        j = json.loads(text)
        j["stats"]["std"][0] = 0
        return json.dumps(j)

    ds = copy_with_manifest(images, tmp_path / "std0", std0)
    with pytest.raises(dstk.Error, match=r"stats.std\[0\]: 0 cannot normalise"):
        dstk.open(ds)


def test_a_fifo_field_file_is_refused_without_waiting(images, tmp_path):
    ds = tmp_path / "fifo"
    shutil.copytree(images, ds)
    (ds / "train_x.npy").unlink()
    os.mkfifo(ds / "train_x.npy")
    # In a child: a hang would otherwise stop the whole test run.
    r = run_python(f"import dstk\ntry:\n    dstk.open({str(ds)!r})\nexcept dstk.Error as e:\n    print(e)", timeout=30)
    assert r.returncode == 0, r
    assert "it is a FIFO, not a regular file" in r.stdout
