"""dstrain --save writes a safetensors file from which numpy alone computes
the same logits as `dstrain predict`; the safetensors package reads it too,
with the names and metadata documented in dstk-format(5)."""
import json

import numpy as np
import pytest

import model_support as ms

SPECS = {
    "small-cnn": "small-cnn",
    "every-layer": "conv3x3:8:p0,bn,relu,res(conv3x3:8:bias,bn,relu),avgpool2,conv3x3:8:s2:bias,relu,maxpool2:s1,"
                   "dropout:0.1,gap,fc:4",
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return ms.make_dataset(tmp_path_factory.mktemp("ds") / "ds")


@pytest.mark.parametrize("model", SPECS)
def test_numpy_logits_match_predict(dataset, tmp_path, model):
    weights = tmp_path / "model.safetensors"
    ms.train(dataset, SPECS[model], weights)
    x = ms.split_array(dataset)
    logits, meta = ms.logits_from_file(weights, x)
    assert meta["format"] == "dstk-model"
    assert meta["classes"] == "4" and meta["input_shape"] == "1x8x8" and meta["input_dtype"] == "u8"
    ms.run("dstrain", "predict", dataset, "--weights", weights, "--device", "cpu", "-o", tmp_path / "p.npy", "-q")
    probs = np.load(tmp_path / "p.npy")
    assert probs.shape == (len(x), 4) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, ms.softmax(logits), atol=2e-4)
    assert (probs.argmax(1) == logits.argmax(1)).mean() > 0.99

    # The same from a .npy on stdin, as JSON lines.
    npy = tmp_path / "x.npy"
    np.save(npy, x[:10])
    p = ms.run("dstrain", "predict", "-", "--weights", weights, "--device", "cpu", "-q", input=npy.read_bytes())
    lines = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert [r["index"] for r in lines] == list(range(10))
    np.testing.assert_allclose([r["probabilities"] for r in lines], probs[:10], atol=1e-6)
    assert [r["class"] for r in lines] == list(probs[:10].argmax(1))


def test_safetensors_package_reads_it(dataset, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    weights = tmp_path / "model.safetensors"
    ms.train(dataset, "small-cnn", weights, epochs=1)
    t = st.load_file(str(weights))
    ours, _ = ms.read_safetensors(weights)
    assert sorted(t) == sorted(ours)
    assert t["0.weight"].shape == (16, 1, 3, 3) and t["1.num_batches_tracked"].dtype == np.int64
    assert t["1.num_batches_tracked"].shape == ()
    assert int(t["1.num_batches_tracked"]) == 12 * 1  # 768 samples / 64 per batch, one epoch
    assert t["9.weight"].shape == (4, 32 * 2 * 2)
    from safetensors import safe_open
    with safe_open(str(weights), "np") as f:
        meta = f.metadata()
    assert meta["model"].startswith("conv3x3:16,bn,relu,maxpool2")
    assert len(json.loads(meta["normalize_mean"])) == 1
    assert meta["dataset_checksum"].startswith("xxh64:")
