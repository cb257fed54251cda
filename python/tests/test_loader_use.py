"""dstk.Loader as PyTorch users' code uses it beyond one loop in one process:
forked children (multiprocessing, a DataLoader's workers), threads, an
abandoned iteration, arguments out of range, and resuming with other settings."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import dstk
from conftest import N

BATCH = 32


def labels(it):
    return np.concatenate([y for _, y in it])


def run_python(code, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("order", ["sequential", "chunk", "full"])
def test_a_forked_child_iterates_from_where_the_loader_stood(index_sets, order):
    # The parent has started its reader threads (one epoch, then a batch of
    # the next); the child continues from the loader's epoch and batch at
    # the fork with threads of its own, and gets the batches the parent gets.
    code = f"""
        import os, sys, numpy as np, dstk
        l = dstk.Loader({str(index_sets['zstd'])!r}, batch={BATCH}, order={order!r}, seed=3, placement="host",
                        convert=False, window=3)
        list(l)
        it = iter(l)
        next(it)
        del it
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            got = np.concatenate([y for _, y in l])
            os.write(w, got.astype(np.int64).tobytes())
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
        _, status = os.waitpid(pid, 0)
        want = np.concatenate([y for _, y in l]).astype(np.int64)
        assert os.WEXITSTATUS(status) == 0, status
        np.testing.assert_array_equal(np.frombuffer(data, np.int64), want)
        print("same", len(want))
    """
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["same", str((N // BATCH - 1) * BATCH)]


def test_an_iteration_begun_before_a_fork_is_an_error_in_the_child(index_sets):
    code = f"""
        import os, dstk
        l = dstk.Loader({str(index_sets['npy'])!r}, batch={BATCH}, placement="host")
        it = iter(l)
        next(it)
        pid = os.fork()
        if pid == 0:
            try:
                next(it)
                os._exit(3)
            except dstk.Error as e:
                os._exit(0 if "forked" in str(e) else 4)
        _, status = os.waitpid(pid, 0)
        print(os.WEXITSTATUS(status), len(list(it)))
    """
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", str(N // BATCH - 1)]


def test_two_threads_on_one_loader_get_an_error_not_a_hang(index_sets):
    # Whichever thread comes second while the first is in the ring gets
    # dstk.Error; none hangs, and a thread that was not refused saw a whole
    # epoch's labels in order.
    loader = dstk.Loader(index_sets["zstd"], batch=BATCH, order="sequential", placement="host", convert=False)
    results = []

    def work():
        try:
            results.append(labels(loader))
        except dstk.Error as e:
            results.append(str(e))

    for _ in range(5):
        results.clear()
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a thread hangs"
        for r in results:
            if isinstance(r, str):
                assert "another thread" in r
            else:
                assert len(r) % BATCH == 0 and np.all(np.diff(r) == 1)


def test_an_abandoned_iteration_does_not_resume(index_sets):
    loader = dstk.Loader(index_sets["npy"], batch=BATCH, placement="host")
    first = iter(loader)
    next(first)
    assert len(labels(loader)) == (N // BATCH - 1) * BATCH  # the newer iteration continues
    epoch = loader.epoch
    with pytest.raises(RuntimeError, match="abandoned"):
        next(first)
    assert loader.epoch == epoch  # and the stale one did not count an epoch


@pytest.mark.parametrize("arg,value", [("batch", -1), ("batch", 1.7), ("batch", "8"),
                                       ("seed", -1), ("seed", 2**64), ("window", 0), ("readers", -1),
                                       ("chunk", -5), ("host_mem", -1), ("keep", -1), ("prefetch", 2.5),
                                       ("epoch", -1), ("order", None), ("split", None),
                                       ("std", [float("inf")] * 3), ("std", [0.0] * 3),
                                       ("mean", [float("nan")] * 3)])
def test_arguments_out_of_range_are_named(images, arg, value):
    with pytest.raises(ValueError, match=arg):
        dstk.Loader(images, placement="host", **{"batch": 8, arg: value})


def test_set_epoch_refuses_a_negative_epoch(images):
    loader = dstk.Loader(images, batch=8, placement="host")
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)


def test_whole_floats_and_bytes_paths_are_taken(images):
    loader = dstk.Loader(os.fsencode(images), batch=8.0, placement="host")
    assert loader.batch == 8


def test_resume_refuses_another_chunk_or_window(index_sets):
    def make(**kw):
        return dstk.Loader(index_sets["npy"], batch=BATCH, placement="host", order="chunk", **kw)

    state = make(chunk=8, window=3).state_dict()
    assert (state["chunk"], state["window"]) == (8, 3)
    make(chunk=8, window=3).load_state_dict(state)
    with pytest.raises(ValueError, match="chunk"):
        make(chunk=16, window=3).load_state_dict(state)
    with pytest.raises(ValueError, match="window"):
        make(chunk=8, window=4).load_state_dict(state)
    old = {k: v for k, v in state.items() if k not in ("chunk", "window")}  # a state from an older dstk
    make(chunk=16, window=3).load_state_dict(old)


def test_resume_refuses_a_mix_with_other_draws(index_sets):
    paths = [index_sets["npy"], index_sets["zstd"]]

    def make(weights):
        return dstk.Loader(paths, batch=BATCH, weights=weights, placement="host")

    state = make([1, 1]).state_dict()
    make([2, 2]).load_state_dict(state)  # the same draws: weights are proportions
    # Draws of 1000 and 333 a member against 333 and 1000: the same epoch size, another order.
    state = make([3, 1]).state_dict()
    assert state["samples"] == make([1, 3]).samples
    with pytest.raises(ValueError, match="mix"):
        make([1, 3]).load_state_dict(state)
