"""scripts/bench-loader-larger-than-ram.py --tiny end to end (root and a
memory cgroup: it skips, saying why, elsewhere): the chess data, a disk pass
before each dstk.Loader run, and a summary that compares each run with its
own disk pass and the loader's memory with its printed ceiling."""
import os
import re
import subprocess
import sys

import pytest

import model_support as ms

SCRIPT = ms.ROOT / "scripts" / "bench-loader-larger-than-ram.py"


def cgroup_why_not():
    """None where the script can make its memory cgroup, else why not."""
    if os.geteuid() != 0:
        return "needs root (memory cgroups, dropping the page cache)"
    v2 = "/sys/fs/cgroup/cgroup.controllers"
    if os.path.exists(v2) and "memory" in open(v2).read():
        root, limit = "/sys/fs/cgroup", "memory.max"
    elif os.path.isdir("/sys/fs/cgroup/memory"):
        root, limit = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
    else:
        return "no memory cgroup controller"
    probe = os.path.join(root, f"dstk-probe-{os.getpid()}")
    try:
        if root.endswith("cgroup"):
            open(os.path.join(root, "cgroup.subtree_control"), "w").write("+memory")
        os.mkdir(probe)
        ok = os.path.exists(os.path.join(probe, limit))
        os.rmdir(probe)
    except OSError as e:
        return f"cannot make a memory cgroup under {root} ({e.strerror})"
    return None if ok else f"a cgroup under {root} has no {limit}"


def test_tiny_run_compares_each_run_with_its_disk_pass(tmp_path):
    pytest.importorskip("dstk")
    why = cgroup_why_not()
    if why:
        pytest.skip(why)
    env = dict(os.environ, DSTK_BIN=str(ms.bin_dir()))
    p = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--runs", "2", "--no-numpy", "--work",
                        str(tmp_path / "work"), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr + p.stdout
    text = (tmp_path / "out" / "summary.txt").read_text()
    # Two disk passes (one before each run), each with both ways of reading.
    disk = next(line for line in text.splitlines() if "right before each run" in line)
    assert len(re.findall(r"direct \d+\.\d+ \((4|16)\)", disk)) == 2, disk
    assert len(re.findall(r"pread \d+\.\d+ \(16\)", disk)) == 2, disk
    run = next(line for line in text.splitlines() if "dstk.Loader fields positions,moves,results" in line)
    assert re.search(r"= \d+\.\d% \[\d+\.\d%-\d+\.\d%\] of the disk's best rate before it", run), run
    assert re.search(r"largest RSS growth [\d.]+ MiB \(anonymous [\d.]+ MiB\)", run), run
    assert "np.load(mmap) + DataLoader: skipped (--no-numpy)" in text
    assert not (tmp_path / "work").exists()  # the data goes unless --keep-data
