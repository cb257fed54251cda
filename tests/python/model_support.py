"""Shared by the test_model_*.py tests: the dstk binaries, a tiny dataset from
dsgen, models trained on it by dstrain (CPU, seconds), and a numpy-only
forward pass of a saved model that reads nothing but the safetensors file."""
import json
import os
import pathlib
import struct
import subprocess

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def bin_dir():
    d = pathlib.Path(os.environ.get("DSTK_BIN", ROOT / "build" / "bin"))
    if not (d / "dstrain").exists():
        raise RuntimeError(f"no dstrain in {d}: build first (cmake --build build) or set DSTK_BIN")
    return d


def run(*args, **kw):
    """Runs a dstk tool; raises with its stderr when it fails."""
    tool, rest = args[0], [str(a) for a in args[1:]]
    p = subprocess.run([str(bin_dir() / tool), *rest], capture_output=True, **kw)
    if p.returncode != 0:
        raise AssertionError(f"{tool} {' '.join(rest)} exited {p.returncode}:\n{p.stderr.decode()}")
    return p


def make_dataset(path, shape="1x8x8", classes=4, train=768, test=200):
    run("dsgen", path, "--train", train, "--test", test, "--shape", shape, "--classes", classes, "--seed", 7, "-q")
    return path


def train(dataset, model, *save, epochs=2):
    args = [dataset, "--model", model, "--device", "cpu", "-T", 2, "--epochs", epochs, "--batch", 64, "-q"]
    for s in save:
        args += ["--save", s]
    run("dstrain", *args)


def read_safetensors(path):
    """Tensors and metadata with numpy and struct alone (the format is a
    u64 header length, a JSON header, then the raw little-endian data)."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    types = {"F32": "<f4", "I64": "<i8"}
    data = raw[8 + n:]
    tensors = {name: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=types[v["dtype"]])
               .reshape(v["shape"]) for name, v in header.items()}
    return tensors, meta


def split_spec(spec):
    """Top-level items of a layer spec: 'a,res(b,c),d' -> ['a', 'res(b,c)', 'd']."""
    items, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    return items + [cur]


def windows(x, k, s, pad=0):
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return w[:, :, ::s, ::s]  # N, C, Ho, Wo, k, k


def split_heads(spec):
    """(trunk spec, [(name, layers spec)]) of a spec that may end in heads(...)."""
    i = spec.find("heads(")
    if i < 0:
        return spec, []
    body, heads, pos = spec[i + 6:-1], [], 0
    while pos < len(body):
        while body[pos] == " ":
            pos += 1
        eq = body.index("=", pos)
        gt = body.index(">", eq)
        end = body.find(",", gt)
        heads.append((body[pos:eq], body[eq + 1:gt]))
        pos = len(body) if end < 0 else end + 1
    return spec[:i].rstrip(","), heads


def forward(spec, t, x, prefix="", side=None):
    """The network of `spec` on x [N, C, H, W] (normalised), in eval mode,
    with tensors named as PyTorch's nn.Sequential would name them; `side`
    [N, S] (normalised) joins where "side" stands."""
    if not spec:
        return x
    for i, item in enumerate(split_spec(spec)):
        name = f"{prefix}{i}."
        parts = item.split(":")
        if item == "side":
            x = np.concatenate([x.reshape(x.shape[0], -1), side], axis=1)[:, :, None, None]
        elif item.startswith("res("):
            x = x + forward(item[4:-1], t, x, f"{name}body.")
        elif item.startswith("conv"):
            k = int(parts[0][4:].split("x")[0])
            stride = next((int(p[1:]) for p in parts[2:] if p.startswith("s")), 1)
            pad = next((int(p[1:]) for p in parts[2:] if p.startswith("p")), k // 2)
            cols = windows(x, k, stride, pad)
            x = np.einsum("nchwij,ocij->nohw", cols, t[name + "weight"], optimize=True)
            if name + "bias" in t:
                x = x + t[name + "bias"][None, :, None, None]
        elif item == "bn":
            m, v = t[name + "running_mean"], t[name + "running_var"]
            g, b = t[name + "weight"], t[name + "bias"]
            x = (x - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + 1e-5) * g[None, :, None, None] \
                + b[None, :, None, None]
        elif item == "relu":
            x = np.maximum(x, 0)
        elif item == "tanh":
            x = np.tanh(x)
        elif item.startswith(("maxpool", "avgpool")):
            k = int(parts[0][7:])
            s = int(parts[1][1:]) if len(parts) > 1 else k
            w = windows(x, k, s)
            x = w.max(axis=(4, 5)) if item.startswith("max") else w.mean(axis=(4, 5))
        elif item == "gap":
            x = x.mean(axis=(2, 3), keepdims=True)
        elif item == "flatten":
            x = x.reshape(x.shape[0], -1, 1, 1)
        elif item.startswith("fc"):
            y = x.reshape(x.shape[0], -1) @ t[name + "weight"].T
            if name + "bias" in t:
                y = y + t[name + "bias"]
            x = y[:, :, None, None]
        elif item.startswith("dropout"):
            pass
        else:
            raise ValueError(f"unknown layer {item}")
    return x


def outputs_from_file(path, samples, side=None):
    """The saved model's raw outputs for raw samples (stored units), numpy
    only: {head name: [N, width]} ("" for a model without heads(...))."""
    t, meta = read_safetensors(path)
    t = {k: v.astype(np.float64) for k, v in t.items()}
    mean = np.array(json.loads(meta["normalize_mean"]))[None, :, None, None]
    std = np.array(json.loads(meta["normalize_std"]))[None, :, None, None]
    c, h, w = (int(d) for d in meta["input_shape"].split("x"))
    x = (samples.astype(np.float64).reshape(-1, c, h, w) - mean) / std
    if side is not None:
        s = json.loads(meta["side_input"])
        per = s["values"] // len(s["normalize_mean"])
        side = (side.astype(np.float64).reshape(len(samples), -1) - np.repeat(s["normalize_mean"], per)) \
            / np.repeat(s["normalize_std"], per)
    trunk, heads = split_heads(meta["model"])
    x = forward(trunk, t, x, side=side)
    if not heads:
        return {"": x.reshape(len(samples), -1)}, meta
    return {name: forward(layers, t, x, f"heads.{name}.").reshape(len(samples), -1) for name, layers in heads}, meta


def logits_from_file(path, samples):
    """The saved model's logits for raw samples (stored units), numpy only."""
    outs, meta = outputs_from_file(path, samples)
    return outs[""], meta


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def split_array(dataset, field="input_field"):
    """The test split's input (or, with field="label_field", label; or the
    field of that name) array."""
    meta = json.loads((pathlib.Path(dataset) / "dataset.json").read_text())
    sp = next(s for s in meta["splits"] if s["name"] == "test")
    name = meta.get(field, "x" if field == "input_field" else "y") if field.endswith("_field") else field
    f = next(f for f in sp["fields"] if f["name"] == name)
    return np.load(pathlib.Path(dataset) / f["file"])


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def softplus(z):
    return np.log1p(np.exp(z))
