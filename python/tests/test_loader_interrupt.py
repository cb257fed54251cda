"""Ctrl-C, and any Python signal handler, ends a dstk.Loader's wait for a read
that never returns (a hung network filesystem), in an iteration, as the
loader is made, or in its times: KeyboardInterrupt comes within a fraction of
a second, the loader goes on with the right batches once the
reads answer again, and the interpreter exits although they never do.

The stall is tests/support/stall_reads.c, preloaded into a child Python: reads
of the label file past a chosen byte block while a gate file exists."""
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dstk
from conftest import N, ROOT, gpu_ready

BATCH = 100
STALLED_FROM = 3  # the first batch whose labels stall (sequential order)
PROMPT = 1.0  # seconds from a signal to the exception: the wait polls every 0.05 s; slack for a loaded machine

# The child's first lines: Ctrl-C as an interactive shell delivers it, even
# where the test runs as a background job (started with SIGINT ignored, which
# the child inherits); a hang shows where every thread is.
PRELUDE = """
import faulthandler, json, os, signal, sys, time
import numpy as np
import dstk
faulthandler.dump_traceback_later(60, exit=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
"""

# A second thread in the child that asks for `loader`'s times every 0.05 s
# until `done` is set; `watched` counts its answers. During the stall its call
# waits (the source's user holds the source while it waits for the read), and
# must not hold the GIL that the main thread's Ctrl-C needs.
WATCHER = """import threading
        done, watched = threading.Event(), [0]
        def watch():
            while not done.wait(0.05):
                loader.times
                watched[0] += 1
        watcher = threading.Thread(target=watch)
        watcher.start()"""



def interrupted_loops(take):
    """The child's two loops over `loader` that Ctrl-C ends: each appends `take` (an expression of y) to `labels`
    and, interrupted, prints its attempt and the loader's next batch."""
    return f"""for attempt in ("interrupted", "interrupted again"):
            try:
                for x, y in loader:
                    labels.append({take})
                print("never stalled", flush=True)
            except KeyboardInterrupt:
                print(attempt, loader.next_batch, flush=True)"""


@pytest.fixture(scope="session")
def stall_library(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the preloaded stall (tests/support/stall_reads.c)")
    out = tmp_path_factory.mktemp("stall") / "stall_reads.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(ROOT / "tests/support/stall_reads.c"), "-ldl"],
                   check=True)
    return out


def label_file(dataset):
    split = next(s for s in json.loads((dataset / "dataset.json").read_text())["splits"] if s["name"] == "train")
    return dataset / next(f for f in split["fields"] if f["name"] == "y")["file"]


class Child:
    """A Python script under the stall: its stdout lines with their arrival times. PATH in the script is
    `path`; reads of `dataset`'s labels stall from sample `stall_from` on."""

    def __init__(self, library, tmp_path, dataset, script, path=None, stall_from=BATCH * STALLED_FROM):
        labels = label_file(dataset).resolve()
        offset = np.load(labels, mmap_mode="r").offset  # the .npy header's bytes
        self.gate = tmp_path / "gate"
        self.gate.touch()
        env = dict(os.environ, LD_PRELOAD=str(library), DSTK_TEST_STALL_GATE=str(self.gate),
                   DSTK_TEST_STALL_PATH=str(labels), DSTK_TEST_STALL_FROM=str(offset + 4 * stall_from))
        path = str(dataset) if path is None else [str(p) for p in path]
        code = PRELUDE + f"PATH = {path!r}\n" + textwrap.dedent(script)
        self.p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put((time.monotonic(), line.strip()))
        self.lines.put((time.monotonic(), None))

    def line(self, timeout=30):
        """(arrival time, line); fails with the child's stderr where none comes."""
        try:
            at, line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.fail(f"no output in {timeout} s")
        if line is None:
            self.fail("ended early")
        return at, line

    def wait_stalled(self):
        stalled = self.gate.with_name(self.gate.name + ".stalled")
        deadline = time.monotonic() + 30
        while not stalled.exists():
            if time.monotonic() > deadline or self.p.poll() is not None:
                self.fail("its reads never stalled")
            time.sleep(0.01)
        time.sleep(0.3)  # the consumer reaches its wait for the stalled batch

    def signal(self, sig=signal.SIGINT):
        sent = time.monotonic()
        self.p.send_signal(sig)
        return sent

    def lift(self):
        self.gate.unlink()

    def interrupt(self, attempt):
        """Ctrl-C: the child prints `attempt` and its loader's next batch within PROMPT; that batch."""
        sent = self.signal()
        at, line = self.line()
        assert line.startswith(attempt + " "), line
        assert at - sent < PROMPT, f"KeyboardInterrupt {at - sent:.2f} s after SIGINT ({attempt})"
        return int(line.split()[-1])

    def go_on(self):
        """Lifts the stall, lets the child finish its epoch; the JSON it prints, after a clean exit."""
        self.lift()
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        result = json.loads(self.line()[1])
        took, err = self.finish()
        assert self.p.returncode == 0, err
        return result

    def finish(self, timeout=30):
        """Waits for the exit; (seconds it took, stderr)."""
        t0 = time.monotonic()
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"no exit in {timeout} s")
        return time.monotonic() - t0, self.p.stderr.read()

    def fail(self, why):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        if self.gate.exists():
            self.gate.unlink()
        pytest.fail(f"the child: {why}; its stderr:\n{self.p.stderr.read()}")


@pytest.mark.parametrize("order", ["sequential", "full"])
def test_ctrl_c_during_a_stalled_read_and_the_loader_goes_on(stall_library, index_sets, tmp_path, order):
    # Sequential: batch 3's chunk is stalled in the window cache's I/O thread;
    # full: reader threads stall in their sample reads from the first batch.
    # The second loop starts while the reads still stall: start_epoch waits
    # for the stuck threads and is interrupted there.
    child = Child(stall_library, tmp_path, index_sets["npy"], f"""
        loader = dstk.Loader(PATH, batch={BATCH}, order={order!r}, seed=3, placement="host", chunk={BATCH},
                             window=2, convert=False, readers=2, prefetch=2)
        labels = []
        {WATCHER}
        print("ready", flush=True)
        {interrupted_loops('y.copy()')}
        sys.stdin.readline()  # the stall is lifted
        for x, y in loader:
            # x of sample i is (arange(N * 12) % 251)[12 i : 12 i + 12] (conftest's index_sets)
            rows = (y[:, None] * 12 + np.arange(12)) % 251
            assert np.array_equal(x.reshape(len(y), 12), rows.astype(np.uint8)), "x and y disagree"
            labels.append(y.copy())
        done.set()
        watcher.join()
        print(json.dumps({{"labels": np.concatenate(labels).tolist(), "state": loader.state_dict(),
                          "chunk": loader.chunk, "watched": watched[0]}}), flush=True)
    """)
    assert child.line()[1] == "ready"
    child.wait_stalled()
    stalled = STALLED_FROM if order == "sequential" else 0
    assert child.interrupt("interrupted") == stalled
    time.sleep(0.3)  # the new loop's start_epoch waits for the stuck threads
    assert child.interrupt("interrupted again") == stalled
    result = child.go_on()
    want = dstk.order_indices(N, 0, order, 3, result["chunk"], 2)[:N // BATCH * BATCH]
    np.testing.assert_array_equal(result["labels"], want)
    assert result["state"]["epoch"] == 1 and result["state"]["batch"] == 0
    assert result["watched"] > 0


def test_ctrl_c_during_a_stalled_read_of_a_mix(stall_library, index_sets, tmp_path):
    # One member's reads stall; its stream restarts with every mix epoch start.
    # Page-cache reads: an O_DIRECT read of the small label file starts at its
    # first byte, which the stall lets through.
    settings = dict(fields=["y", "dataset", "index"], batch=BATCH, order="sequential", seed=3, placement="stream",
                    device="cpu", chunk=BATCH, window=2, convert=False, direct=False)
    paths = [index_sets["npy"], index_sets["zstd"]]
    want = [np.stack([b["dataset"], b["index"], b["y"]]) for b in dstk.Loader(paths, **settings)]
    child = Child(stall_library, tmp_path, index_sets["npy"], f"""
        loader = dstk.Loader(PATH, **{settings!r})
        rows = []
        print("ready", flush=True)
        for attempt in ("interrupted", "interrupted again"):
            try:
                for b in loader:
                    rows.append(np.stack([b["dataset"], b["index"], b["y"]]).tolist())
                print("never stalled", flush=True)
            except KeyboardInterrupt:
                print(attempt, loader.next_batch, flush=True)
        sys.stdin.readline()  # the stall is lifted
        for b in loader:
            rows.append(np.stack([b["dataset"], b["index"], b["y"]]).tolist())
        print(json.dumps(rows), flush=True)
    """, path=paths)
    assert child.line()[1] == "ready"
    child.wait_stalled()
    stalled = child.interrupt("interrupted")
    assert 0 < stalled < len(want)
    time.sleep(0.3)
    assert child.interrupt("interrupted again") == stalled
    rows = child.go_on()
    assert len(rows) == len(want)
    for got, expected in zip(rows, want):
        np.testing.assert_array_equal(got, expected)


def test_ctrl_c_ends_the_script_although_the_read_never_returns(stall_library, index_sets, tmp_path):
    child = Child(stall_library, tmp_path, index_sets["npy"], f"""
        loader = dstk.Loader(PATH, batch={BATCH}, order="sequential", placement="host", chunk={BATCH},
                             convert=False)
        print("ready", flush=True)
        for x, y in loader:
            pass
    """)
    assert child.line()[1] == "ready"
    child.wait_stalled()
    child.signal()
    took, err = child.finish()
    assert "KeyboardInterrupt" in err
    assert child.p.returncode != 0
    # The exit stops the loader's threads for up to a second, then leaves
    # those stuck in a read to the process's exit.
    assert took < 10, f"exit took {took:.1f} s"
    assert child.gate.exists()  # the read never returned
    child.lift()


def test_a_signal_handler_runs_while_the_loader_waits(stall_library, index_sets, tmp_path):
    # A handler that returns lets the wait go on; one that raises ends it.
    child = Child(stall_library, tmp_path, index_sets["npy"], f"""
        loader = dstk.Loader(PATH, batch={BATCH}, order="sequential", placement="host", chunk={BATCH},
                             convert=False)
        calls = []
        def on_alarm(sig, frame):
            calls.append(sig)
            if len(calls) == 2:
                raise TimeoutError("the second alarm")
        signal.signal(signal.SIGALRM, on_alarm)
        print("ready", flush=True)
        try:
            for x, y in loader:
                pass
        except TimeoutError as e:
            print(e, len(calls), loader.next_batch, flush=True)
    """)
    assert child.line()[1] == "ready"
    child.wait_stalled()
    child.signal(signal.SIGALRM)
    time.sleep(0.3)
    sent = child.signal(signal.SIGALRM)
    at, line = child.line()
    assert line == f"the second alarm 2 {STALLED_FROM}"
    assert at - sent < PROMPT
    took, err = child.finish()
    assert child.p.returncode == 0, err
    assert took < 10, f"exit took {took:.1f} s"
    child.lift()


def test_ctrl_c_while_the_loader_reads_the_split_into_memory(stall_library, index_sets, tmp_path):
    # The device placement reads the whole split as the loader is made: the
    # wait for it ends at Ctrl-C although the read never returns, and a
    # loader made once the reads answer delivers the whole epoch.
    child = Child(stall_library, tmp_path, index_sets["npy"], f"""
        settings = dict(batch={BATCH}, order="sequential", placement="device", device="cpu", convert=False)
        print("ready", flush=True)
        try:
            dstk.Loader(PATH, **settings)
            print("never stalled", flush=True)
        except KeyboardInterrupt:
            print("interrupted 0", flush=True)
        sys.stdin.readline()  # the stall is lifted
        labels = [y.copy() for x, y in dstk.Loader(PATH, **settings)]
        print(json.dumps({{"labels": np.concatenate(labels).tolist()}}), flush=True)
    """, stall_from=0)
    assert child.line()[1] == "ready"
    child.wait_stalled()
    assert child.interrupt("interrupted") == 0
    assert child.gate.exists()  # the read had not returned
    result = child.go_on()
    np.testing.assert_array_equal(result["labels"], np.arange(N // BATCH * BATCH))


@pytest.mark.skipif(not gpu_ready(), reason="needs a CUDA GPU, PyTorch with CUDA, and dstk built with CUDA")
def test_ctrl_c_during_a_stalled_read_on_the_gpu(stall_library, index_sets, tmp_path):
    # The cuda backend: the consumer waits for the loader's feeder thread,
    # which waits for the stream's readers; Ctrl-C ends the consumer's wait,
    # and the next iteration's start_epoch stops the feeder (its own check)
    # although the read it waits for never returns. A second thread asks for
    # the loader's times meanwhile.
    child = Child(stall_library, tmp_path, index_sets["npy"], f"""
        import torch
        loader = dstk.Loader(PATH, batch={BATCH}, order="sequential", seed=3, placement="stream", device="cuda:0",
                             chunk={BATCH}, window=2, convert=False, readers=2, prefetch=2)
        assert loader.on_gpu
        labels = []
        {WATCHER}
        print("ready", flush=True)
        {interrupted_loops('torch.from_dlpack(y).cpu().numpy().copy()')}
        sys.stdin.readline()  # the stall is lifted
        for x, y in loader:
            labels.append(torch.from_dlpack(y).cpu().numpy().copy())
        done.set()
        watcher.join()
        print(json.dumps({{"labels": np.concatenate(labels).tolist(), "chunk": loader.chunk,
                          "watched": watched[0]}}), flush=True)
    """)
    assert child.line(timeout=60)[1] == "ready"
    child.wait_stalled()
    for attempt in ("interrupted", "interrupted again"):
        assert child.interrupt(attempt) <= STALLED_FROM
        time.sleep(0.3)
    result = child.go_on()
    assert result["watched"] > 0
    want = dstk.order_indices(N, 0, "sequential", 3, result["chunk"], 2)[:N // BATCH * BATCH]
    got = result["labels"]
    # The batches before the stall, then the whole epoch once it is lifted.
    np.testing.assert_array_equal(got[len(got) - len(want):], want)
    np.testing.assert_array_equal(got[:len(got) - len(want)], want[:len(got) - len(want)])
