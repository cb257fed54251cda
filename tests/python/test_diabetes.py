"""Real data: scikit-learn's diabetes set (442 patients, 10 features, a
disease-progression score). dsconvert imports it from an npz written with
numpy, dstrain trains an MLP with --loss mse, and `dstrain eval` reports R^2
on a held-out 20% beside scikit-learn's linear regression on the same split
(about 0.45)."""
import json

import numpy as np
import pytest

import model_support as ms


def test_diabetes_mlp_r2_beside_linear_regression(tmp_path):
    datasets = pytest.importorskip("sklearn.datasets")
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import train_test_split
    x, y = datasets.load_diabetes(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=42)
    linear = LinearRegression().fit(xtr, ytr).score(xte, yte)
    # The targets as a user scales them for mse (R^2 does not change).
    mu, sd = ytr.mean(), ytr.std()
    np.savez(tmp_path / "diabetes.npz", x_train=xtr.astype(np.float32),
             y_train=((ytr - mu) / sd).astype(np.float32), x_test=xte.astype(np.float32),
             y_test=((yte - mu) / sd).astype(np.float32))
    ms.run("dsconvert", tmp_path / "diabetes.npz", tmp_path / "ds", "-q")
    ms.run("dstrain", tmp_path / "ds", "--model", "mlp:32", "--loss", "mse", "--optimizer", "adamw", "--lr", "0.003",
           "--weight-decay", "0.05", "--epochs", 60, "--batch", 32, "--device", "cpu", "-T", 2,
           "--save", tmp_path / "m.safetensors", "-q")
    report = json.loads(ms.run("dstrain", "eval", tmp_path / "ds", "--weights", tmp_path / "m.safetensors",
                               "--device", "cpu", "--json", "-q").stdout)
    r2 = report["heads"][0]["r2"]
    print(f"diabetes, held-out 20% (89 patients): dstrain mlp:32 R2 {r2:.3f}, "
          f"scikit-learn LinearRegression R2 {linear:.3f}")
    assert report["samples"] == len(yte)
    assert 0.3 < r2 < 0.7
    assert abs(r2 - linear) < 0.15
