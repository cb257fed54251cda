"""dstrain --save model.onnx: onnxruntime runs the export and gives the
probabilities `dstrain predict` gives from the safetensors file of the same
run."""
import numpy as np
import pytest

import model_support as ms

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("model", ["small-cnn", "conv3x3:8:p0,bn,relu,res(conv3x3:8:bias,bn,relu),avgpool2,"
                                   "conv3x3:8:s2:bias,relu,maxpool2:s1,dropout:0.1,gap,fc:4", "mlp:16"])
def test_onnxruntime_matches_predict(tmp_path, model):
    ds = ms.make_dataset(tmp_path / "ds")
    ms.train(ds, model, tmp_path / "m.safetensors", tmp_path / "m.onnx", epochs=1)
    x = ms.split_array(ds)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input"]
    (logits,) = sess.run(["logits"], {"input": x.astype(np.float32).reshape(len(x), 1, 8, 8)})
    ms.run("dstrain", "predict", ds, "--weights", tmp_path / "m.safetensors", "--device", "cpu",
           "-o", tmp_path / "p.npy", "-q")
    np.testing.assert_allclose(ms.softmax(logits.astype(np.float64)), np.load(tmp_path / "p.npy"), atol=2e-4)
    meta = sess.get_modelmeta().custom_metadata_map
    assert meta["format"] == "dstk-model" and meta["classes"] == "4"
