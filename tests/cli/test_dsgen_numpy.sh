#!/usr/bin/env bash
# numpy reads dsgen's .npy files with mmap and sees the values dsgen wrote.
. "$(dirname "$0")/lib.sh"
PY=$(numpy_python)
[ -n "$PY" ] || skip "no python3 with numpy (apt-get install python3-numpy; scripts/test.sh installs it)"
cat >"$WORK/check.py" <<'PY'
import json, sys, numpy as np
d, dt = sys.argv[1], sys.argv[2]
m = json.load(open(d + "/dataset.json"))
want = {"u8": np.uint8, "bf16": np.uint16, "f16": np.float16, "f32": np.float32}[dt]
for split in m["splits"]:
    n = split["samples"]
    for f in split["fields"]:
        path = d + "/" + f["file"]
        a = np.load(path, mmap_mode="r")
        assert isinstance(a, np.memmap), path
        assert a.shape == (n, *f["shape"]), (a.shape, f)
        raw = open(path, "rb").read()
        assert len(raw) == f["bytes"]
        # The array's bytes are the file's last n * itemsize * prod(shape) bytes.
        assert a.tobytes() == raw[len(raw) - a.nbytes:], path
        if f["name"] == "y":
            assert a.dtype == np.int32 and a.min() >= 0 and a.max() < m["num_classes"]
            assert len(np.unique(a)) == m["num_classes"]
        else:
            assert a.dtype == want, (a.dtype, want)
            v = a.astype(np.float32) if dt != "bf16" else (a.astype(np.uint32) << 16).view(np.float32)
            assert np.isfinite(v).all()
            if split["name"] == "train":
                mean = v.reshape(n, f["shape"][0], -1).mean(axis=(0, 2))
                assert np.allclose(mean, m["stats"]["mean"], rtol=1e-3), (mean, m["stats"])
print("ok")
PY
for dt in u8 bf16 f16 f32; do
    expect_exit 0 "$BIN/dsgen" "$WORK/d-$dt" --train 2000 --test 300 --dtype $dt --classes 7 -q
    expect_exit 0 "$PY" "$WORK/check.py" "$WORK/d-$dt" "$dt"
    expect_stdout "^ok"
done
finish
