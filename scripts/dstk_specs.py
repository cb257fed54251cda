"""dstrain's model presets as layer specs (lib/src/train/model.cpp, resolve_model()), for the
scripts that build dstrain's networks in other frameworks (torch_baseline.py, jax_baseline.py)."""

# "{c}" is the class count.
PRESETS = {
    "ref-cnn": "conv3x3:32,bn,relu,conv3x3:32,bn,relu,maxpool2,conv3x3:64,bn,relu,conv3x3:64,bn,relu,maxpool2,"
               "conv3x3:128,bn,relu,maxpool2,flatten,fc:256,relu,fc:{c}",
    "small-cnn": "conv3x3:16,bn,relu,maxpool2,conv3x3:32,bn,relu,maxpool2,flatten,fc:{c}",
    "resnet9": "conv3x3:64,bn,relu,conv3x3:128,bn,relu,maxpool2,res(conv3x3:128,bn,relu,conv3x3:128,bn,relu),"
               "conv3x3:256,bn,relu,maxpool2,conv3x3:512,bn,relu,maxpool2,res(conv3x3:512,bn,relu,conv3x3:512,bn,relu),"
               "gap,flatten,fc:{c}",
}


def resolve_spec(model, classes):
    """The layer spec of a preset, mlp[:W1,W2,...] or a spec given as is."""
    if model in PRESETS:
        return PRESETS[model].format(c=classes)
    if model == "mlp" or model.startswith("mlp:"):
        widths = "1024,512" if model == "mlp" else model[4:]
        return "flatten," + "".join(f"fc:{w},relu," for w in widths.split(",")) + f"fc:{classes}"
    return model
