"""Models with heads and a side input leave files that other code reads the
same: numpy alone (from the safetensors file), a PyTorch twin with the same
heads (strict load_state_dict; skipped without torch) and onnxruntime (one
output per head) give what `dstrain predict` gives."""
import json
import pathlib
import sys

import numpy as np
import pytest

import model_support as ms

sys.path.insert(0, str(ms.ROOT / "scripts"))


@pytest.fixture(scope="module")
def chess(tmp_path_factory):
    """A chess-shaped dataset with a side input, a two-head model trained on it (.safetensors and .onnx) and the
    predictions of `dstrain predict` for its test split."""
    d = tmp_path_factory.mktemp("chess")
    r = np.random.default_rng(5)

    def split(n):
        pos = (r.random((n, 12, 8, 8)) < 0.06).astype(np.float32)
        moves = r.integers(0, 16, n).astype(np.int32)
        results = np.sign(pos[:, 1].sum((1, 2)) - pos[:, 7].sum((1, 2))).astype(np.int8)
        clock = r.normal(size=(n, 2)).astype(np.float32)
        return pos, moves, results, clock

    p, m, res, c = split(256)
    pt, mt, rt, ct = split(64)
    np.savez(d / "chess.npz", positions_train=p, moves_train=m, results_train=res, clock_train=c,
             positions_test=pt, moves_test=mt, results_test=rt, clock_test=ct)
    ms.run("dsconvert", d / "chess.npz", d / "ds", "--x-array", "positions", "--y-array", "moves",
           "--num-classes", 16, "-q")
    label = json.loads((d / "ds" / "dataset.json").read_text())["label_field"]
    spec = (f"conv3x3:4,bn,relu,flatten,fc:16,relu,heads(policy=fc:16>ce:{label}, "
            "value=fc:4,tanh,fc:1,tanh>mse:results*0.5)")
    ms.run("dstrain", d / "ds", "--model", spec, "--side-input", "clock", "--device", "cpu", "-T", 2, "--epochs", 2,
           "--batch", 32, "--save", d / "m.safetensors", "--save", d / "m.onnx", "-q")
    ms.run("dstrain", "predict", d / "ds", "--weights", d / "m.safetensors", "--device", "cpu", "-o", d / "p.npy",
           "-q")
    return {"dir": d, "x": ms.split_array(d / "ds"), "clock": ms.split_array(d / "ds", "clock"),
            "policy": np.load(d / "p.policy.npy"), "value": np.load(d / "p.value.npy")}


def test_numpy_matches_predict(chess):
    outs, meta = ms.outputs_from_file(chess["dir"] / "m.safetensors", chess["x"], chess["clock"])
    assert meta["format_version"] == "2"
    assert [h["name"] for h in json.loads(meta["heads"])] == ["policy", "value"]
    assert json.loads(meta["side_input"])["field"] == "clock"
    assert chess["policy"].shape == (64, 16) and chess["value"].shape == (64, 1)
    np.testing.assert_allclose(chess["policy"], ms.softmax(outs["policy"]), atol=2e-4)
    np.testing.assert_allclose(chess["value"], outs["value"], atol=2e-4)


def test_torch_twin_loads_strictly_and_agrees(chess):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    import torch_baseline as tb
    _, meta = ms.read_safetensors(chess["dir"] / "m.safetensors")
    side = json.loads(meta["side_input"])
    model, _ = tb.build_model(meta["model"], (12, 8, 8), 16, side=side["values"])
    model.load_state_dict(load_file(str(chess["dir"] / "m.safetensors")), strict=True)
    model.eval()
    mean = torch.tensor(json.loads(meta["normalize_mean"])).view(1, -1, 1, 1)
    std = torch.tensor(json.loads(meta["normalize_std"])).view(1, -1, 1, 1)
    x = (torch.from_numpy(chess["x"]) - mean) / std
    s = (torch.from_numpy(chess["clock"]) - torch.tensor(side["normalize_mean"])) / torch.tensor(side["normalize_std"])
    with torch.no_grad():
        out = model(x, s)
    np.testing.assert_allclose(chess["policy"], torch.softmax(out["policy"], 1).numpy(), atol=2e-4)
    np.testing.assert_allclose(chess["value"], out["value"].numpy(), atol=2e-4)


def test_onnxruntime_gives_one_output_per_head(chess):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(chess["dir"] / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input", "side"]
    assert [o.name for o in sess.get_outputs()] == ["policy", "value"]
    policy, value = sess.run(None, {"input": chess["x"], "side": chess["clock"]})
    np.testing.assert_allclose(chess["policy"], ms.softmax(policy.astype(np.float64)), atol=2e-4)
    np.testing.assert_allclose(chess["value"], value, atol=2e-4)


@pytest.mark.parametrize("loss,link", [("poisson", ms.softplus), ("poisson-exp", np.exp), ("bce", ms.sigmoid)])
def test_rates_and_probabilities_of_one_head(tmp_path, loss, link):
    """A model without heads(...): predict writes the rates (or probabilities) its link gives; ONNX's "logits" are
    the raw outputs."""
    r = np.random.default_rng(7)
    x = r.normal(size=(160, 6)).astype(np.float32)
    y = (r.poisson(np.log1p(np.exp(x[:, :3]))) if loss != "bce" else x[:, :3] > 0).astype(np.float32)
    np.savez(tmp_path / "n.npz", x_train=x[:128], y_train=y[:128], x_test=x[128:], y_test=y[128:])
    ms.run("dsconvert", tmp_path / "n.npz", tmp_path / "ds", "-q")
    ms.run("dstrain", tmp_path / "ds", "--model", "mlp:8", "--loss", loss, "--device", "cpu", "-T", 2, "--epochs", 2,
           "--batch", 32, "--save", tmp_path / "m.safetensors", "--save", tmp_path / "m.onnx", "-q")
    p = ms.run("dstrain", "predict", tmp_path / "ds", "--weights", tmp_path / "m.safetensors", "--device", "cpu",
               "-q")
    key = "probabilities" if loss == "bce" else "rates"
    got = np.array([json.loads(line)[key] for line in p.stdout.decode().splitlines()])
    outs, _ = ms.outputs_from_file(tmp_path / "m.safetensors", x[128:])
    np.testing.assert_allclose(got, link(outs[""]), atol=2e-4, rtol=1e-4)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (raw,) = sess.run(["logits"], {"input": x[128:].reshape(32, 6, 1, 1)})
    np.testing.assert_allclose(link(raw.astype(np.float64)), got, atol=2e-4, rtol=1e-4)
