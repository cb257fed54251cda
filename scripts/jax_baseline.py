#!/usr/bin/env python3
"""dstrain's networks in JAX, as a JAX user would write the training loop.

The twin of scripts/torch_baseline.py for XLA: the same presets and layer specs
(man dstrain), the same data (a dstk dataset, the train split loaded into GPU
memory once as stored, u8 normalised inside the step), SGD with Nesterov
momentum 0.9 and weight decay 5e-4, BN in training mode (momentum 0.1,
eps 1e-5), softmax cross-entropy. Steps are fused the way JAX users fuse them:
one jitted function runs --scan steps with lax.scan, parameters, optimiser
state and BN statistics carried through, batches sliced from the resident
split in the scan. Activations are NHWC (XLA's and Flax's layout).

--precision tf32: float32 storage, TF32 matrix units (jax_default_matmul_precision
"tensorfloat32"); bf16: mixed precision as in dstrain and PyTorch's autocast,
bf16 activations and compute copies of the weights, float32 master weights,
BN statistics and loss; fp32: full float32 ("highest").

Prints, per batch size, samples/s of the median of --repeats timed calls
(each --scan steps, after one warm-up call that compiles); with --json one
JSON document {"model", "precision", "batches": {B: samples_per_second}}."""
import argparse, json, os, statistics, sys, time

import numpy as np

from dstk_specs import resolve_spec

def parse(spec):
    """A spec as a nested list of items: ("res", [items]) for a residual block, else the item's text."""
    stack = [[]]
    item = ""
    i = 0
    while i < len(spec):
        if spec.startswith("res(", i) and not item:
            stack.append([])
            i += 4
            continue
        ch = spec[i]
        if ch in ",)":
            if item:
                stack[-1].append(item)
            item = ""
            if ch == ")":
                body = stack.pop()
                stack[-1].append(("res", body))
        else:
            item += ch
        i += 1
    if item:
        stack[-1].append(item)
    if len(stack) != 1:
        raise SystemExit("jax_baseline: unbalanced res( ) in the spec")
    return stack[0]


def build(items, shape, key, jax, jnp):
    """(params, states, layers, out shape) for a spec on a (C, H, W) input; parameters as PyTorch initialises them."""
    c, h, w = shape
    params, states, layers = [], [], []
    for item in items:
        key, sub = jax.random.split(key)
        if isinstance(item, tuple):
            p, s, body, _ = build(item[1], (c, h, w), sub, jax, jnp)
            params.append(p)
            states.append(s)
            layers.append(("res", body))
            continue
        parts = item.split(":")
        head = parts[0]
        p, s, arg = {}, {}, None
        if head.startswith("conv"):
            if len(parts) > 2:
                raise SystemExit(f"jax_baseline: conv options ('{item}') are not in the JAX twin")
            arg, out = int(head[4:].split("x")[0]), int(parts[1])
            bound = 1.0 / np.sqrt(c * arg * arg)
            p = {"w": jax.random.uniform(sub, (arg, arg, c, out), jnp.float32, -bound, bound)}
            c = out
        elif head == "bn":
            p, s = {"g": jnp.ones(c), "b": jnp.zeros(c)}, {"mean": jnp.zeros(c), "var": jnp.ones(c)}
        elif head == "fc":
            out = int(parts[1])
            bound = 1.0 / np.sqrt(c * h * w)
            k1, k2 = jax.random.split(sub)
            p = {"w": jax.random.uniform(k1, (c * h * w, out), jnp.float32, -bound, bound),
                 "b": jax.random.uniform(k2, (out,), jnp.float32, -bound, bound)}
            c, h, w = out, 1, 1
        elif head.startswith("maxpool") and len(parts) == 1:
            arg = int(head[7:])
            h, w = h // arg, w // arg
        elif head == "gap":
            h = w = 1
        elif head == "flatten":
            c, h, w = c * h * w, 1, 1
        elif head != "relu":
            raise SystemExit(f"jax_baseline: layer '{item}' is not in the JAX twin (conv, bn, relu, maxpool, gap, "
                             "flatten, fc, res)")
        params.append(p)
        states.append(s)
        layers.append((head if not head.startswith("conv") else "conv", arg))
    return params, states, layers, (c, h, w)


def apply(layers, params, states, x, dtype, jax, jnp, lax):
    new_states = []
    for (kind, arg), p, s in zip(layers, params, states):
        if kind == "res":
            y, s2 = apply(arg, p, s, x, dtype, jax, jnp, lax)
            x = x + y
            new_states.append(s2)
            continue
        if kind == "conv":
            x = lax.conv_general_dilated(x, p["w"].astype(dtype), (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        elif kind == "bn":
            axes = tuple(range(x.ndim - 1))
            xf = x.astype(jnp.float32)
            mean = xf.mean(axes)
            var = jnp.maximum((xf * xf).mean(axes) - mean * mean, 0.0)
            x = ((xf - mean) * lax.rsqrt(var + 1e-5) * p["g"] + p["b"]).astype(dtype)
            n = xf.size // xf.shape[-1]
            s = {"mean": 0.9 * s["mean"] + 0.1 * mean, "var": 0.9 * s["var"] + 0.1 * var * n / max(n - 1, 1)}
        elif kind == "relu":
            x = jnp.maximum(x, 0)
        elif kind.startswith("maxpool"):
            x = lax.reduce_window(x, -jnp.inf, lax.max, (1, arg, arg, 1), (1, arg, arg, 1), "VALID")
        elif kind == "gap":
            x = x.mean((1, 2), keepdims=True)
        elif kind == "flatten":
            x = x.reshape(x.shape[0], -1)
        elif kind == "fc":
            x = x @ p["w"].astype(dtype) + p["b"].astype(dtype)
        new_states.append(s)
    return x, new_states


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", help="a dstk dataset directory (u8 input, i32 labels)")
    ap.add_argument("--model", default="ref-cnn", help="ref-cnn, small-cnn, resnet9 or a spec (man dstrain)")
    ap.add_argument("--batches", default="256", help="batch sizes, comma-separated (a batch-size curve)")
    ap.add_argument("--precision", default="tf32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--scan", type=int, default=50, help="training steps fused into one call with lax.scan")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per batch size")
    ap.add_argument("--lr", type=float, help="learning rate (default: dstrain's, 0.05 x batch / 256)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    a = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from jax import lax
    jax.config.update("jax_default_matmul_precision",
                      {"fp32": "highest", "tf32": "tensorfloat32", "bf16": "bfloat16"}[a.precision])
    dtype = jnp.bfloat16 if a.precision == "bf16" else jnp.float32

    meta = json.load(open(os.path.join(a.dataset, "dataset.json")))
    split = next(s for s in meta["splits"] if s["name"] == "train")
    fields = {f["name"]: f for f in split["fields"]}
    xf, yf = fields[meta.get("input_field", "x")], fields[meta.get("label_field", "y")]
    if xf["dtype"] != "u8":
        raise SystemExit("jax_baseline: the twin reads u8 inputs (dsgen --dtype u8)")
    x = np.load(os.path.join(a.dataset, xf["file"]), mmap_mode="r")
    y = np.load(os.path.join(a.dataset, yf["file"]), mmap_mode="r")
    classes = meta.get("num_classes") or int(np.max(y)) + 1
    # The split resident on the GPU as stored (u8), NHWC; per-channel statistics as dstrain takes them.
    x_dev = jax.device_put(np.ascontiguousarray(np.asarray(x).transpose(0, 2, 3, 1)))
    y_dev = jax.device_put(np.asarray(y, dtype=np.int32))
    sample = np.asarray(x[:: max(1, len(x) // 4096)], dtype=np.float64)
    mean = jnp.asarray(sample.mean((0, 2, 3)), jnp.float32)
    std = jnp.asarray(sample.std((0, 2, 3)) + 1e-6, jnp.float32)

    spec = resolve_spec(a.model, classes)
    items = parse(spec)

    results = {}
    for batch in [int(b) for b in a.batches.split(",")]:
        params, states, layers, _ = build(items, x.shape[1:], jax.random.PRNGKey(0), jax, jnp)
        momentum = jax.tree_util.tree_map(jnp.zeros_like, params)
        steps_per_pass = x_dev.shape[0] // batch
        lr = a.lr if a.lr is not None else 0.05 * batch / 256

        def loss_fn(params, states, xb, yb):
            xn = ((xb.astype(jnp.float32) - mean) / std).astype(dtype)
            logits, new_states = apply(layers, params, states, xn, dtype, jax, jnp, lax)
            logits = logits.astype(jnp.float32)
            loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], axis=1))
            return loss, new_states

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def step(carry, k):
            params, momentum, states = carry
            i = (k % steps_per_pass) * batch
            xb = lax.dynamic_slice_in_dim(x_dev, i, batch)
            yb = lax.dynamic_slice_in_dim(y_dev, i, batch)
            (loss, states), g = grad_fn(params, states, xb, yb)
            g = jax.tree_util.tree_map(lambda gi, pi: gi + 5e-4 * pi, g, params)
            momentum = jax.tree_util.tree_map(lambda m, gi: 0.9 * m + gi, momentum, g)
            params = jax.tree_util.tree_map(lambda p, m, gi: p - lr * (gi + 0.9 * m), params, momentum, g)
            return (params, momentum, states), loss

        @jax.jit
        def run(carry, start):
            return lax.scan(step, carry, start + jnp.arange(a.scan))

        carry = (params, momentum, states)
        carry, losses = run(carry, 0)  # compiles
        jax.block_until_ready(losses)
        times = []
        for r in range(a.repeats):
            t0 = time.perf_counter()
            carry, losses = run(carry, (r + 1) * a.scan)
            jax.block_until_ready(losses)
            times.append(time.perf_counter() - t0)
        if not np.isfinite(float(losses[-1])):
            raise SystemExit(f"jax_baseline: non-finite loss at batch {batch}")
        results[batch] = batch * a.scan / statistics.median(times)
        if not a.json:
            print(f"jax {a.model} {a.precision} batch {batch}: {results[batch]:.0f} samples/s "
                  f"(median of {a.repeats} calls of {a.scan} steps; last loss {float(losses[-1]):.3f})")
    if a.json:
        json.dump({"model": a.model, "precision": a.precision, "scan": a.scan,
                   "batches": {str(b): v for b, v in results.items()}}, sys.stdout)
        print()


if __name__ == "__main__":
    main()
