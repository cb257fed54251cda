#!/usr/bin/env python3
"""dstrain's networks in PyTorch, on the same dataset.

The twin: build_model() turns a dstrain preset or layer spec (man dstrain) into
an nn.Sequential with one module per spec item, numbered from 0, a res(...)
block being one module whose body is an nn.Sequential; parameter names are
therefore those of dstrain's saved models ("0.weight" for a first conv,
"1.running_mean" for the BN after it, "9.weight" / "9.bias" for small-cnn's
fc). A spec with heads(...) or a side input becomes a Twin: the same trunk
numbering, each head an nn.Sequential under "heads.NAME", forward(x, side)
returning {head: output}. dstk_init() fills it with dstrain's initialisation, bit for bit (same
seed, same Philox streams: PyTorch's default scheme, uniform +-1/sqrt(fan_in)
for weights and biases).

Mode "curve" trains that twin as `dstrain --order sequential` does: the same
normalisation (per-channel mean and std from up to 4096 evenly spaced train
samples), batches in file order (the last partial one skipped), the same
optimiser, schedule and warm-up formulas, BN momentum 0.1 and eps 1e-5, and
prints one line per epoch (train loss and accuracy measured during the epoch,
test loss and accuracy after it), on --device cpu or cuda; with --json, one
JSON document. scripts/compare-torch-cpu.sh puts it beside dstrain's.

Modes "eager" and "compile" (torch.compile reduce-overhead, CUDA graphs) are
throughput baselines with the whole split in GPU memory; "memmap" is the seeds'
recipe: the split read through an np.memmap Dataset by DataLoader(shuffle, 4
workers, pin_memory), batches copied with non_blocking, eager training: the
end-to-end baseline for dstrain's stream placement. --precision bf16 is
PyTorch's mixed precision: bf16 autocast with channels_last tensors, fp32
master weights."""
import argparse, json, math, os, sys, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dstk_specs import resolve_spec

def tokens(spec):
    """Items of a spec in plan order: 'res(' and ')' are items of their own, as in dstrain's NetworkPlan."""
    out, item = [], ""
    i = 0
    while i < len(spec):
        if spec.startswith("res(", i) and not item:
            out.append("res(")
            i += 4
        elif spec[i] in ",)":
            if item:
                out.append(item)
            item = ""
            if spec[i] == ")":
                out.append(")")
            i += 1
        else:
            item += spec[i]
            i += 1
    if item:
        out.append(item)
    return out


class Residual(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class Linear(nn.Linear):
    """nn.Linear that also takes C x 1 x 1 inputs, as dstrain's fc does after gap without flatten."""

    def forward(self, x):
        return super().forward(x.flatten(1))


def split_heads(spec):
    """(trunk spec, [(name, layers spec, loss or None, target, weight)]) of a spec that may end in heads(...)."""
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
        end = len(body) if end < 0 else end
        target, weight = body[gt + 1:end], 1.0
        if "*" in target:
            target, w = target.split("*")
            weight = float(w)
        loss, _, field = target.rpartition(":")
        heads.append((body[pos:eq], body[eq + 1:gt], loss or None, field, weight))
        pos = end + 1
    return spec[:i].rstrip(","), heads


class Side(nn.Identity):
    """Where the side input joins (dstrain's "side"): Twin.forward concatenates it to the flat features."""


class Twin(nn.Module):
    """A model with heads or a side input: the trunk's modules numbered from 0 as in an nn.Sequential ("side" takes
    a number and has no parameters), the heads under heads.NAME; forward(x, side) returns {name: output} (the
    trunk's output without heads)."""

    def __init__(self, trunk, heads):
        super().__init__()
        self.size = len(trunk)
        for i, m in enumerate(trunk):
            self.add_module(str(i), m)
        self.heads = nn.ModuleDict(heads) if heads else None

    def forward(self, x, side=None):
        for i in range(self.size):
            m = getattr(self, str(i))
            x = torch.cat([x.flatten(1), side.to(x.dtype)], 1) if isinstance(m, Side) else m(x)
        return {name: h(x) for name, h in self.heads.items()} if self.heads is not None else x


def build_items(spec, shape, side, first_index, planned):
    """Top-level modules of a layer list on a (c, h, w, flat) tensor; appends (plan index, module) to `planned`.
    Returns (modules, shape after them, plan index after them)."""
    c, h, w, flat = shape
    stack = [[]]
    index = first_index
    for index, t in enumerate(tokens(spec) if spec else [], first_index):
        parts = t.split(":")
        head = parts[0]
        if t == "res(":
            stack.append([])
            continue
        if t == ")":
            body = stack.pop()
            stack[-1].append(Residual(nn.Sequential(*body)))
            continue
        if head.startswith("conv"):
            k = int(head[4:].split("x")[0])
            out, stride, pad, bias = int(parts[1]), 1, k // 2, False
            for o in parts[2:]:
                if o == "bias":
                    bias = True
                elif o.startswith("s"):
                    stride = int(o[1:])
                elif o.startswith("p"):
                    pad = int(o[1:])
            m = nn.Conv2d(c, out, k, stride=stride, padding=pad, bias=bias)
            c, h, w = out, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        elif head == "bn":
            m = nn.BatchNorm1d(c) if flat else nn.BatchNorm2d(c)
        elif head == "relu":
            m = nn.ReLU()
        elif head == "tanh":
            m = nn.Tanh()
        elif head == "side":
            m = Side()
            c, h, w, flat = c * h * w + side, 1, 1, True
        elif head.startswith("maxpool") or head.startswith("avgpool"):
            k = int(head[7:])
            s = int(parts[1][1:]) if len(parts) > 1 else k
            m = (nn.MaxPool2d if head[0] == "m" else nn.AvgPool2d)(k, s)
            h, w = (h - k) // s + 1, (w - k) // s + 1
        elif head == "gap":
            m = nn.AdaptiveAvgPool2d(1)
            h = w = 1
        elif head == "flatten":
            m = nn.Flatten()
            c, h, w, flat = c * h * w, 1, 1, True
        elif head == "fc":
            m = Linear(c, int(parts[1]), bias=len(parts) < 3)
            c, flat = int(parts[1]), True
        elif head == "dropout":
            m = nn.Dropout(float(parts[1]))
        else:
            raise SystemExit(f"torch_baseline: unknown layer '{t}' in the spec")
        stack[-1].append(m)
        planned.append((index, m))
    return stack[0], (c, h, w, flat), (index + 1 if spec else first_index)


def build_model(model, in_shape, classes, side=0):
    """(module, [(plan index, module)]) for a preset or spec on a C x H x W input: an nn.Sequential, or a Twin
    where the spec has heads(...) or a side input of `side` values."""
    trunk_spec, heads = split_heads(resolve_spec(model, classes))
    planned = []
    trunk, shape, index = build_items(trunk_spec, (*in_shape, False), side, 0, planned)
    if not heads and not any(isinstance(m, Side) for m in trunk):
        return nn.Sequential(*trunk), planned
    built = {}
    for name, layers, _, _, _ in heads:
        # The head's own layer of dstrain's plan takes an index; its layers follow it.
        modules, _, index = build_items(layers, shape, side, index + 1, planned)
        built[name] = nn.Sequential(*modules)
    return Twin(trunk, built), planned


def philox_u64(seed, stream, count):
    """The first `count` values of dstk's CounterRng(seed, stream).next_u64() (lib/include/dstk/rng.hpp)."""
    mask = np.uint64(0xFFFFFFFF)
    n = (count + 1) // 2
    ctr = np.arange(n, dtype=np.uint64)
    c0, c1 = ctr & mask, ctr >> np.uint64(32)
    c2 = np.full(n, stream & 0xFFFFFFFF, np.uint64)
    c3 = np.full(n, stream >> 32, np.uint64)
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & mask,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & mask)
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    # Each block gives two values: words 2,3 first, then words 0,1.
    first, second = (c2 << np.uint64(32)) | c3, (c0 << np.uint64(32)) | c1
    return np.stack([first, second], axis=1).reshape(-1)[:count]


def dstk_init(planned, seed):
    """dstrain's init_parameters(): per plan layer i, stream 0x7061726d0000 + i; W then bias, uniform +-1/sqrt(fan_in)."""
    with torch.no_grad():
        for index, m in planned:
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in)
                count = m.weight.numel() + (m.bias.numel() if m.bias is not None else 0)
                u = (philox_u64(seed, 0x7061726D0000 + index, count) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
                v = torch.from_numpy((-bound + (2 * bound) * u).astype(np.float32))
                m.weight.copy_(v[:m.weight.numel()].view_as(m.weight))
                if m.bias is not None:
                    m.bias.copy_(v[m.weight.numel():])
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.reset_parameters()


def load(dataset, split):
    meta = json.load(open(os.path.join(dataset, "dataset.json")))
    sp = next(s for s in meta["splits"] if s["name"] == split)
    fields = {f["name"]: f for f in sp["fields"]}
    x = np.load(os.path.join(dataset, fields[meta.get("input_field", "x")]["file"]), mmap_mode="r")
    y = np.load(os.path.join(dataset, fields[meta.get("label_field", "y")]["file"]), mmap_mode="r")
    dtype = fields[meta.get("input_field", "x")]["dtype"]
    return np.array(x), np.asarray(y).astype(np.int64), dtype, meta.get("num_classes", int(y.max()) + 1)


def host_float(x, dtype):
    t = torch.from_numpy(x)
    if dtype == "bf16":
        t = t.view(torch.int16).view(torch.bfloat16)
    elif dtype == "f16":
        t = t.view(torch.float16)
    t = t.float()
    # dstrain's shapes: D is D x 1 x 1, H x W is 1 x H x W.
    return t.view(t.shape[0], -1, 1, 1) if t.dim() == 2 else t.unsqueeze(1) if t.dim() == 3 else t


def to_float(x, dtype):
    return host_float(x, dtype).cuda()


def dstrain_stats(x):
    """Per-channel mean and std as dstrain computes them without manifest stats (run/train_run.cpp channel_stats)."""
    n = x.shape[0]
    take = min(n, 4096)
    s = x[[k * n // take for k in range(take)]].double().transpose(0, 1).reshape(x.shape[1], -1)
    mean = s.mean(dim=1)
    std = torch.sqrt(torch.clamp((s * s).mean(dim=1) - mean * mean, min=1e-12))
    return mean.float().view(1, -1, 1, 1), std.float().view(1, -1, 1, 1)


def learning_rate(a, steps_per_epoch, step):
    """optimizer.cpp learning_rate(): warm-up, then constant, step or cosine (computed in double, used as float)."""
    total, warm = steps_per_epoch * a.epochs, round(a.warmup_epochs * steps_per_epoch)
    lr = a.lr
    if warm > 0 and step < warm:
        return float(np.float32(lr * (step + 1) / warm))
    if a.schedule == "step" and a.step_epochs:
        lr *= a.gamma ** (step // (a.step_epochs * steps_per_epoch))
    elif a.schedule == "cosine" and total > warm:
        lr *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / (total - warm))))
    return float(np.float32(lr))


def run_curve(a):
    """Trains the twin as dstrain --order sequential would; one dict per epoch."""
    dev = torch.device(a.device)
    x, y, dtype, classes = load(a.dataset, "train")
    xt, yt, _, _ = load(a.dataset, "test")
    xf = host_float(x, dtype)
    mean, std = dstrain_stats(xf)
    xf = ((xf - mean) / std).to(dev)
    xtf = ((host_float(xt, dtype) - mean) / std).to(dev)
    yf, ytf = torch.from_numpy(y).to(dev), torch.from_numpy(yt).to(dev)
    model, planned = build_model(a.model, tuple(xf.shape[1:]), classes)
    dstk_init(planned, a.seed)
    model.to(dev)
    lr = a.lr if a.lr is not None else (0.05 * a.batch / 256 if a.optimizer == "sgd" else 0.002)
    a.lr = lr
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=a.momentum, nesterov=not a.no_nesterov,
                              weight_decay=a.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=a.weight_decay, eps=1e-8)
    steps = xf.shape[0] // a.batch
    out, step = [], 0
    for epoch in range(1, a.epochs + 1):
        model.train()
        loss_sum, correct = 0.0, 0
        t0 = time.perf_counter()
        for s in range(steps):
            xb, yb = xf[s * a.batch:(s + 1) * a.batch], yf[s * a.batch:(s + 1) * a.batch]
            for g in opt.param_groups:
                g["lr"] = learning_rate(a, steps, step)
            logits = model(xb)
            loss = F.cross_entropy(logits, yb, label_smoothing=a.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            # dstrain reports the loss without smoothing
            plain = F.cross_entropy(logits.detach(), yb) if a.label_smoothing else loss
            loss_sum += plain.item() * a.batch
            correct += int((logits.argmax(1) == yb).sum())
        seconds = time.perf_counter() - t0
        model.eval()
        tl, tc = 0.0, 0
        with torch.no_grad():
            for s in range(0, xtf.shape[0], a.batch):
                lg = model(xtf[s:s + a.batch])
                tl += float(F.cross_entropy(lg, ytf[s:s + a.batch], reduction="sum"))
                tc += int((lg.argmax(1) == ytf[s:s + a.batch]).sum())
        e = {"epoch": epoch, "train_loss": loss_sum / (steps * a.batch), "train_accuracy": correct / (steps * a.batch),
             "test_loss": tl / max(1, xtf.shape[0]), "test_accuracy": tc / max(1, xtf.shape[0]), "seconds": seconds}
        out.append(e)
        print(f"epoch {epoch}/{a.epochs}  loss {e['train_loss']:.4f}  train acc {100 * e['train_accuracy']:.2f}%  "
              f"test acc {100 * e['test_accuracy']:.2f}%  time {seconds:.1f} s",
              file=sys.stderr if a.json else sys.stdout, flush=True)
    return out


# dstrain's losses (man dstrain, TARGETS, LOSSES AND METRICS), PyTorch's default reductions.
LOSSES = {
    "ce": lambda z, y: F.cross_entropy(z, y.long()),
    "mse": lambda z, y: F.mse_loss(z, y.view_as(z)),
    "poisson": lambda z, y: F.poisson_nll_loss(F.softplus(z), y.view_as(z), log_input=False),
    "poisson-exp": lambda z, y: F.poisson_nll_loss(z, y.view_as(z), log_input=True),
    "bce": lambda z, y: F.binary_cross_entropy_with_logits(z, y.view_as(z)),
}


def objective(spec, label, loss):
    """(the fields the loss reads, loss(outputs, {field: batch})) of a spec: its heads' weighted losses, or one
    `loss` on `label` for a spec without heads."""
    _, heads = split_heads(spec)
    if not heads:
        return [label], lambda out, t: LOSSES[loss](out.float(), t[label])
    terms = [(name, LOSSES[lo or "ce"], field, w) for name, _, lo, field, w in heads]
    return sorted({f for _, _, f, _ in terms}), \
        lambda out, t: sum(w * fn(out[name].float(), t[field]) for name, fn, field, w in terms)


def run(mode, model_name, x, targets, classes, batch, epochs, lr, bf16, loss_of=None):
    """Training throughput with the split in GPU memory: targets {field: tensor}; loss_of(outputs, {field: batch})
    (default: cross-entropy on the only target)."""
    torch.manual_seed(0)
    n, c, h, w = x.shape
    model = build_model(model_name, (c, h, w), classes)[0].cuda()
    if loss_of is None:
        (field,) = targets
        loss_of = lambda out, t: F.cross_entropy(out, t[field])
    if bf16:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4,
                          fused=(mode != "eager"))

    def step(xb, tb):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(model(xb), tb)
        loss.backward()
        opt.step()
        return loss

    if mode == "compile":
        step = torch.compile(step, mode="reduce-overhead")
    steps = n // batch

    def at(i):
        return x[i * batch:(i + 1) * batch], {k: v[i * batch:(i + 1) * batch] for k, v in targets.items()}

    model.train()
    for i in range(min(steps, 30)):  # warm-up (compilation, cuDNN autotune)
        step(*at(i))
    torch.cuda.synchronize()
    rates = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for i in range(steps):
            step(*at(i))
        torch.cuda.synchronize()
        rates.append(steps * batch / (time.perf_counter() - t0))
    return max(rates)


def load_field(dataset, split, name):
    """A field of a split as stored (numpy)."""
    meta = json.load(open(os.path.join(dataset, "dataset.json")))
    sp = next(s for s in meta["splits"] if s["name"] == split)
    f = next(f for f in sp["fields"] if f["name"] == name)
    return np.load(os.path.join(dataset, f["file"]))


def compiled_ref_cnn(ds, lr=0.05):
    """The twin of ref-cnn for a dstk dataset (dstk.open), as the Python loader
    benchmarks train it: tf32, its SGD step compiled (reduce-overhead: CUDA
    graphs). Returns (step, mean, std): mean and std the split's per-channel
    stats as (1, C, 1, 1) GPU tensors, to normalise raw batches."""
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    c, h, w = ds["train"]["x"].sample_shape
    mean = torch.tensor(ds.manifest["stats"]["mean"], device="cuda").view(1, c, 1, 1)
    std = torch.tensor(ds.manifest["stats"]["std"], device="cuda").view(1, c, 1, 1)
    torch.manual_seed(0)
    model = build_model("ref-cnn", (c, h, w), ds.manifest.get("num_classes", 10))[0].cuda()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=True)

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    model.train()
    return torch.compile(step, mode="reduce-overhead"), mean, std


class MemmapSamples(torch.utils.data.Dataset):
    """One sample per item from the .npy files, opened lazily in each worker."""

    def __init__(self, xpath, ypath):
        self.xpath, self.ypath, self.x = xpath, ypath, None
        self.n = np.load(ypath, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.x is None:
            self.x = np.load(self.xpath, mmap_mode="r")
            self.y = np.load(self.ypath, mmap_mode="r")
        return torch.from_numpy(np.array(self.x[i])), int(self.y[i])


def run_memmap(dataset, model_name, dtype, classes, mean, std, batch, epochs, lr, bf16, workers=4):
    meta = json.load(open(os.path.join(dataset, "dataset.json")))
    sp = next(s for s in meta["splits"] if s["name"] == "train")
    fields = {f["name"]: f for f in sp["fields"]}
    xpath = os.path.join(dataset, fields[meta.get("input_field", "x")]["file"])
    ypath = os.path.join(dataset, fields[meta.get("label_field", "y")]["file"])
    loader = torch.utils.data.DataLoader(MemmapSamples(xpath, ypath), batch_size=batch, shuffle=True,
                                         num_workers=workers, pin_memory=True, drop_last=True,
                                         persistent_workers=True)
    torch.manual_seed(0)
    c, h, w = np.load(xpath, mmap_mode="r").shape[1:]
    model = build_model(model_name, (c, h, w), classes)[0].cuda()
    if bf16:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    model.train()
    rates = []
    for epoch in range(epochs + 1):  # the first epoch warms up workers and cuDNN autotune
        t0, seen = time.perf_counter(), 0
        for xb, yb in loader:
            xb = to_float_gpu(xb.cuda(non_blocking=True), dtype)
            xb = (xb - mean) / std
            if bf16:
                xb = xb.contiguous(memory_format=torch.channels_last)
            yb = yb.cuda(non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            seen += xb.shape[0]
        torch.cuda.synchronize()
        if epoch > 0:
            rates.append(seen / (time.perf_counter() - t0))
    return max(rates)


def to_float_gpu(t, dtype):
    if dtype == "bf16":
        t = t.view(torch.int16).view(torch.bfloat16)
    elif dtype == "f16":
        t = t.view(torch.float16)
    return t.float()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: curve, eager, compile, memmap")
    ap.add_argument("-m", "--model", default="ref-cnn", help="dstrain preset or layer spec")
    ap.add_argument("-b", "--batch", type=int, default=256)
    ap.add_argument("-e", "--epochs", type=int, default=None, help="default 5 for curve, 2 for the others")
    ap.add_argument("--lr", type=float, default=None, help="default as dstrain: 0.05 x batch/256 (sgd), 0.002 (adamw)")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default=None,
                    help="default fp32 for curve, tf32 for the others")
    ap.add_argument("--json", action="store_true")
    g = ap.add_argument_group("curve (dstrain's options, same defaults)")
    g.add_argument("--device", default="cpu", help="cpu or cuda")
    g.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    g.add_argument("--momentum", type=float, default=0.9)
    g.add_argument("--no-nesterov", action="store_true")
    g.add_argument("--weight-decay", type=float, default=5e-4)
    g.add_argument("--schedule", choices=["constant", "step", "cosine"], default="cosine")
    g.add_argument("--warmup-epochs", type=float, default=0.0)
    g.add_argument("--step-epochs", type=int, default=0)
    g.add_argument("--gamma", type=float, default=0.1)
    g.add_argument("--label-smoothing", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("-T", "--threads", type=int, default=0, help="CPU threads for --device cpu (0: PyTorch's default)")
    g = ap.add_argument_group("targets of eager and compile (dstrain's options): a spec with heads(...) reads its own")
    g.add_argument("--label", default=None, help="the target field (default: the dataset's label)")
    g.add_argument("--loss", choices=sorted(LOSSES), default="ce")
    a = ap.parse_args()
    curve_only = a.modes == "curve"
    a.precision = a.precision or ("fp32" if curve_only else "tf32")
    a.epochs = a.epochs or (5 if curve_only else 2)
    tf32 = a.precision in ("tf32", "bf16")
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    if a.threads:
        torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "batch": a.batch, "precision": a.precision, "model": a.model, "modes": {}}
    if "curve" in a.modes.split(","):
        out["modes"]["curve"] = run_curve(a)
    gpu_modes = [m for m in a.modes.split(",") if m != "curve"]
    if gpu_modes:
        torch.backends.cudnn.benchmark = True
        x, y, dtype, classes = load(a.dataset, "train")
        meta = json.load(open(os.path.join(a.dataset, "dataset.json")))
        spec = resolve_spec(a.model, classes)
        fields, loss_of = objective(spec, a.label or meta.get("label_field", "y"), a.loss)
        if not split_heads(spec)[1] and a.loss != "ce":  # a preset ends in the target's width
            width = int(np.prod(load_field(a.dataset, "train", fields[0]).shape[1:]))
            spec = resolve_spec(a.model, width)
        # As float (classes are exact below 2^24; the ce loss takes them as integers).
        targets = {f: torch.from_numpy(load_field(a.dataset, "train", f).astype(np.float32)).cuda() for f in fields}
        xg = to_float(x, dtype)
        mean = xg.mean(dim=(0, 2, 3), keepdim=True)
        std = xg.std(dim=(0, 2, 3), keepdim=True)
        xg = ((xg - mean) / std).contiguous()
        lr = a.lr if a.lr is not None else 0.05
        out.update({"cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
                    "samples": int(xg.shape[0])})
        for mode in gpu_modes:
            if mode == "memmap":
                r = run_memmap(a.dataset, a.model, dtype, classes, mean, std, a.batch, a.epochs, lr,
                               a.precision == "bf16")
            else:
                r = run(mode, spec, xg, targets, classes, a.batch, a.epochs, lr, a.precision == "bf16", loss_of)
            out["modes"][mode] = r
            print(f"torch {mode:8s} {r:12,.0f} samples/s", file=sys.stderr if a.json else sys.stdout, flush=True)
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
