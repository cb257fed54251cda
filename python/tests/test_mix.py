"""dstk.Loader on a mix of datasets: values equal the members' arrays at the
reported (dataset, index); quotas and proportions against a reference in
Python; no sample twice in an epoch; pure in (seed, epoch); resume."""
import math

import numpy as np
import pytest

import dstk

from conftest import gpu_ready, make_dataset

SIZES = (300, 170, 410)
BATCH = 32


@pytest.fixture(scope="session")
def members(tmp_path_factory):
    """Three datasets with the same fields: x u8[2x3] random, y i32, aux f32[2]; (dirs, arrays)."""
    tmp = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(7)
    dirs, arrays = [], []
    for m, n in enumerate(SIZES):
        a = {"x_train": rng.integers(0, 256, (n, 2, 3), dtype=np.uint8),
             "y_train": rng.integers(0, 5, n).astype(np.int32),
             "aux_train": rng.normal(size=(n, 2)).astype(np.float32)}
        dirs.append(make_dataset(tmp, f"m{m}", a, "--x-array", "x", "--y-array", "y"))
        arrays.append(a)
    return dirs, arrays


def reference_quotas(sizes, weights):
    """mix.hpp's epoch: the member with the largest weight/size seen once, the others in proportion."""
    r = max(range(len(sizes)), key=lambda m: (weights[m] / sizes[m], -m))
    return [sizes[m] if m == r else min(sizes[m], math.floor(sizes[r] * weights[m] / weights[r] + 0.5))
            for m in range(len(sizes))]


def epoch_rows(loader):
    return [(b["dataset"], b["index"]) for b in loader]


def loader(dirs, **kw):
    settings = dict(fields=["x", "y", "aux", "dataset", "index"], batch=BATCH, seed=3, device="cpu",
                    convert=False, chunk=40, window=2)
    settings.update(kw)
    return dstk.Loader(dirs, **settings)


@pytest.mark.parametrize("placement", ["auto", "stream", ["device", "host", "stream"]])
def test_values_are_the_members_arrays_at_dataset_and_index(members, placement):
    dirs, arrays = members
    ld = loader(dirs, weights=[2, 1, 3], placement=placement)
    seen = 0
    for b in ld:
        assert b["dataset"].dtype == np.int32 and b["index"].dtype == np.int64
        for j, (m, i) in enumerate(zip(b["dataset"], b["index"])):
            np.testing.assert_array_equal(b["x"][j], arrays[m]["x_train"][i])
            assert b["y"][j] == arrays[m]["y_train"][i]
            np.testing.assert_array_equal(b["aux"][j], arrays[m]["aux_train"][i])
            seen += 1
    assert seen == len(ld) * BATCH


@pytest.mark.parametrize("weights", [None, [2, 1, 3], [1, 5, 1], [10, 1, 1]])
def test_quotas_and_proportions_match_the_reference(members, weights):
    dirs, _ = members
    w = list(SIZES) if weights is None else weights
    quotas = reference_quotas(SIZES, w)
    ld = loader(dirs, weights=weights, drop_last=False)
    assert ld.samples == sum(quotas)
    assert [m["quota"] for m in ld.plan["mix"]["members"]] == quotas
    rows = epoch_rows(ld)
    counts = [0] * len(SIZES)
    taken = set()
    levels = math.ceil(math.log2(len(SIZES)))
    for ds, ix in rows:
        for m, i in zip(ds.tolist(), ix.tolist()):
            assert (m, i) not in taken, f"member {m} row {i} twice in the epoch"
            taken.add((m, i))
            counts[m] += 1
        if len(ds) == BATCH:  # every batch holds each member's share, to a sample per tree level
            for m in range(len(SIZES)):
                share = quotas[m] / sum(quotas)
                assert abs(int((ds == m).sum()) - share * BATCH) <= levels + 1
    assert counts == quotas


def test_the_order_is_pure_in_seed_and_epoch(members):
    dirs, _ = members

    def rows(seed, epoch, **kw):
        ld = loader(dirs, seed=seed, epoch=epoch, **kw)
        return np.concatenate([np.stack([d, i]) for d, i in epoch_rows(ld)], axis=1)

    a = rows(3, 1)
    np.testing.assert_array_equal(a, rows(3, 1, readers=1, prefetch=2, placement="stream"))
    assert not np.array_equal(a, rows(3, 2))
    assert not np.array_equal(a, rows(4, 1))


def test_resume_mid_epoch(members):
    dirs, _ = members
    whole = epoch_rows(loader(dirs, weights=[1, 2, 1], epoch=2))
    first = loader(dirs, weights=[1, 2, 1], epoch=2)
    for k, _ in enumerate(first):
        if k == 6:
            break
    state = first.state_dict()
    resumed = loader(dirs, weights=[1, 2, 1])
    resumed.load_state_dict(state)
    rest = epoch_rows(resumed)
    assert len(rest) == len(whole) - 7
    for (d1, i1), (d2, i2) in zip(rest, whole[7:]):
        np.testing.assert_array_equal(d1, d2)
        np.testing.assert_array_equal(i1, i2)
    with pytest.raises(ValueError, match="samples"):
        loader(dirs, weights=[5, 2, 1]).load_state_dict(state)


def test_the_plan_describes_each_member(members):
    dirs, _ = members
    ld = loader(dirs, placement=["device", "host", "stream"])
    assert ld.plan["placement"] == "mix"
    assert [m["placement"] for m in ld.plan["mix"]["members"]] == ["device", "host", "stream"]
    lines = ld.describe()
    assert len(lines) == len(SIZES) + 1
    assert ": device," in lines[0] and ": host," in lines[1] and ": stream," in lines[2]
    assert "host ceiling" in lines[-1]


def test_normalised_input_takes_the_mixs_statistics(members):
    dirs, arrays = members
    ld = dstk.Loader(dirs, fields=["x"], batch=BATCH, device="cpu")
    mean, std = ld._impl.norms["x"]
    quotas = reference_quotas(SIZES, SIZES)
    allx = np.concatenate([a["x_train"].astype(np.float64).ravel() for a in arrays])
    assert quotas == list(SIZES)
    assert mean[0] == pytest.approx(allx.mean(), rel=1e-4)
    assert std[0] == pytest.approx(allx.std(), rel=1e-3)


def test_mix_errors(members, tmp_path):
    dirs, _ = members
    with pytest.raises(dstk.Error, match="weights lists 2 weights for 3 datasets"):
        loader(dirs, weights=[1, 2])
    with pytest.raises(dstk.Error, match="has no field 'aux'"):
        other = make_dataset(tmp_path, "other", {"x_train": np.zeros((50, 2, 3), np.uint8),
                                                 "y_train": np.zeros(50, np.int32)}, "--x-array", "x",
                             "--y-array", "y")
        loader([dirs[0], other])
    with pytest.raises(dstk.Error, match="invalid placement 'managed'"):
        loader(dirs, placement="managed")
    with pytest.raises(dstk.Error, match="applies to a mix"):
        dstk.Loader(dirs[0], weights=[1], device="cpu")
    with pytest.raises(ValueError, match="names no dataset"):
        dstk.Loader([], device="cpu")


@pytest.mark.skipif(not gpu_ready(), reason="needs a CUDA GPU, PyTorch with CUDA, and dstk built with CUDA")
@pytest.mark.parametrize("placement", ["auto", ["device", "host", "stream"]])
def test_gpu_mix_equals_the_cpu_mix(members, placement):
    import torch
    dirs, _ = members
    names = ["x", "y", "aux", "dataset", "index"]
    cpu = [dict(b) for b in loader(dirs, weights=[2, 1, 3], placement=placement)]
    gpu = loader(dirs, weights=[2, 1, 3], placement=placement, device="cuda:0")
    assert gpu.on_gpu
    got = 0
    for want, b in zip(cpu, gpu):
        for name in names:
            t = torch.from_dlpack(b[name])
            assert t.is_cuda
            assert torch.equal(t.cpu(), torch.from_numpy(np.asarray(want[name]))), name
        got += 1
    assert got == len(cpu) == len(gpu)
