"""dstk.Loader on a GPU with PyTorch: DLPack batches against the host path,
every placement, streams, batch lifetime, resume. Skips without a GPU."""
import numpy as np
import pytest

import dstk

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (dstk.built_with_cuda and torch.cuda.is_available()),
                                reason="needs a CUDA GPU, PyTorch with CUDA, and dstk built with CUDA")

SETTINGS = dict(batch=64, order="chunk", seed=2, chunk=100)


def host_batches(path, **kw):
    return [(x, y) for x, y in dstk.Loader(path, placement="host", **{**SETTINGS, **kw})]


@pytest.mark.parametrize("placement", ["stream", "device", "managed"])
def test_gpu_batches_equal_host_batches(images, placement):
    expect = host_batches(images)
    loader = dstk.Loader(images, placement=placement, device="cuda:0", **SETTINGS)
    assert loader.on_gpu and loader.device_bytes > 0
    got = 0
    for (hx, hy), (x, y) in zip(expect, loader):
        assert x.__dlpack_device__() == (2, 0)
        assert x.shape == hx.shape and x.dtype == "float32" and y.shape == hy.shape and y.dtype == "int32"
        tx, ty = torch.from_dlpack(x), torch.from_dlpack(y)
        assert tx.is_cuda and tx.dtype == torch.float32 and tuple(tx.shape) == hx.shape
        assert ty.dtype == torch.int32
        torch.testing.assert_close(tx.cpu(), torch.from_numpy(hx), rtol=1e-5, atol=1e-5)
        assert torch.equal(ty.cpu(), torch.from_numpy(hy))
        got += 1
    assert got == len(expect) == len(loader)
    assert loader.times["batches"] == got


def test_raw_batches_and_side_stream(images):
    expect = host_batches(images, convert=False)
    loader = dstk.Loader(images, placement="stream", convert=False, **SETTINGS)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # from_dlpack passes this stream: it waits for the batch
        sums = [torch.from_dlpack(x).to(torch.int64).sum() for x, _ in loader]
    torch.cuda.synchronize()
    assert [int(s) for s in sums] == [int(hx.astype(np.int64).sum()) for hx, _ in expect]


def test_batch_stays_valid_for_keep_batches(images):
    expect = host_batches(images)
    loader = dstk.Loader(images, placement="stream", keep=2, **SETTINGS)
    it = iter(loader)
    held = [torch.from_dlpack(next(it)[0])]
    held.append(torch.from_dlpack(next(it)[0]))
    held.append(torch.from_dlpack(next(it)[0]))  # batch 0 + keep: batch 0 still intact
    torch.cuda.synchronize()
    for k, t in enumerate(held):
        torch.testing.assert_close(t.cpu(), torch.from_numpy(expect[k][0]))


def test_resume_on_gpu(images):
    whole = [torch.from_dlpack(y).cpu() for _, y in dstk.Loader(images, placement="stream", **SETTINGS)]
    first = dstk.Loader(images, placement="stream", **SETTINGS)
    for k, _ in enumerate(first):
        if k == 3:
            break
    resumed = dstk.Loader(images, placement="device", **SETTINGS)  # the order does not depend on placement
    resumed.load_state_dict(first.state_dict())
    rest = [torch.from_dlpack(y).cpu() for _, y in resumed]
    assert len(rest) == len(whole) - 4
    for a, b in zip(rest, whole[4:]):
        assert torch.equal(a, b)


def test_bad_device_raises(images):
    with pytest.raises(dstk.Error):
        dstk.Loader(images, placement="stream", device="cuda:99", **SETTINGS)


@pytest.mark.parametrize("placement", ["stream", "device"])
def test_torch_output_equals_host_batches(images, placement):
    # drop_last=False: the short last batch takes its own tensors over its slot.
    expect = host_batches(images, drop_last=False)
    loader = dstk.Loader(images, placement=placement, output="torch", drop_last=False, **SETTINGS)
    assert loader.labels == "int64"
    for epoch in range(2):  # the second epoch hands out the slots' tensors again
        got = [(x.clone(), y.clone()) for x, y in loader]
        torch.cuda.synchronize()
        assert len(got) == len(expect) and expect[-1][0].shape[0] < SETTINGS["batch"]
        for (hx, hy), (x, y) in zip(expect, got):
            assert x.is_cuda and x.dtype == torch.float32 and y.dtype == torch.int64
            torch.testing.assert_close(x.cpu(), torch.from_numpy(hx), rtol=1e-5, atol=1e-5)
            assert torch.equal(y.cpu(), torch.from_numpy(hy).long())
        expect = host_batches(images, drop_last=False, epoch=epoch + 1)


def test_torch_output_waits_on_the_current_stream(images):
    expect = host_batches(images, convert=False, labels="int64")
    loader = dstk.Loader(images, placement="stream", convert=False, output="torch", **SETTINGS)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # each batch is taken while `side` is current: it waits there
        sums = [(x.to(torch.int64).sum(), y.sum()) for x, y in loader]
    torch.cuda.synchronize()
    assert [(int(a), int(b)) for a, b in sums] == [(int(hx.astype(np.int64).sum()), int(hy.sum())) for hx, hy in expect]


def test_int64_labels_as_device_arrays(images):
    expect = host_batches(images)
    for (hx, hy), (x, y) in zip(expect, dstk.Loader(images, placement="stream", labels="int64", **SETTINGS)):
        assert y.dtype == "int64"
        assert torch.equal(torch.from_dlpack(y).cpu(), torch.from_numpy(hy).long())


@pytest.mark.parametrize("output", ["arrays", "torch"])
def test_work_enqueued_on_a_held_batch_is_protected(images, output):
    # The consumer holds batch 0 and keep=2 after it, then, before taking batch
    # 3, enqueues slow work on batch 0. The feeder converts ahead into batch
    # 0's slot once batch 3 is taken; that conversion must wait for the work.
    expect = host_batches(images, convert=False)
    loader = dstk.Loader(images, placement="stream", convert=False, keep=2, output=output, **SETTINGS)
    it = iter(loader)
    view = (lambda b: b) if output == "torch" else torch.from_dlpack
    x0 = view(next(it)[0])
    next(it), next(it)
    torch.cuda._sleep(200_000_000)  # some tens of ms on the current stream
    total = x0.to(torch.int64).sum()
    for _ in range(3):  # batch 3 ends batch 0's life; the feeder reuses its slot ahead
        next(it)
    torch.cuda.synchronize()
    assert int(total) == int(expect[0][0].astype(np.int64).sum())
