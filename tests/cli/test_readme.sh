#!/usr/bin/env bash
# README's Tour, run as written, in order, in one fresh directory, on small
# data: each ```sh line of the Tour runs through bash with the tools on PATH.
# Placeholders the README names get small fixtures (data/, big/, data.npz,
# cols.bin, cifar-10-batches-bin/, chess.npz, rec1.npz, rec2.npz, neuro.npz,
# before.json/after.json, the MNIST files);
# sizes shrink by the explicit rewrites below, and dstrain runs 1 epoch on the
# CPU. Lines that cannot run here are listed in SKIP with the reason; a line
# that is in neither list and fails, fails the test. Then the bench-then-train
# line runs a second time: README's commands must run twice in a row.
source "$(dirname "$0")/lib.sh"
need_doc_tools "README's dsconvert line"
README="$(dirname "$0")/../../README.md"

# Lines that cannot run on this machine (substring match), with the reason.
SKIP=(
    "producer | dsconvert"        # 'producer' stands for any program writing raw samples
    "sudo dsbench"                # needs root and sudo to drop the page cache
    "scripts/fio-compare.sh"      # needs fio; scripts are tested on their own
    "dstrain big/ --data managed" # needs a GPU (cudaMallocManaged)
)
command -v mpirun >/dev/null || SKIP+=("mpirun ") # needs Open MPI (scripts/setup.sh)
# python -m dstk.plot and --plot: a python with matplotlib and the dstk package
# (scripts/test.sh installs it into build/venv before ctest), as `python`.
PLOT_PY=$(plot_python package)
if [ -n "$PLOT_PY" ]; then
    mkdir -p "$WORK/py"
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$PLOT_PY" >"$WORK/py/python"
    chmod +x "$WORK/py/python"
    export DSTK_PYTHON=$PLOT_PY
else
    SKIP+=("python -m dstk.plot" "--plot ") # needs the dstk package (pip install ./python) and matplotlib
fi
# mpirun as root in CI's container, with more ranks than its 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# Small sizes for big ones; every dstrain line trains 1 epoch on 2 CPU threads;
# dsbench measures once, briefly, on 4 MiB (as its own tests do).
rewrite() {
    sed -E -e 's/--train (1M|10M)/--train 2K/' \
        -e "$DSTRAIN_ONE_EPOCH" \
        -e 's/(dsbench all [^ ]+)/\1 --repetitions 1 --min-time 0 --size 4M/g' <<<"$1"
}

# The Tour's sh blocks, comments off.
mapfile -t LINES < <(awk '/^## Tour/{t=1} /^## Measured/{t=0} t&&/^```sh/{b=1;next} t&&/^```/{b=0} b' "$README" |
    strip_shell_comments)
expect_true "README's Tour has command lines" test "${#LINES[@]}" -gt 30

# Fixtures, in a directory whose ../shared is the shared folder.
RUN="$WORK/run"
mkdir -p "$RUN"
ln -s "$(cd "$SHARED" && pwd)" "$WORK/shared"
cd "$RUN" || exit 1
ln -s "$MNIST/t10k-images-idx3-ubyte.gz" "$MNIST/t10k-labels-idx1-ubyte.gz" .
export PATH="$BIN:$WORK/py:$PATH"
dsgen data/ --train 512 --test 128 --shape 3x16x16 --classes 10 -q
dsgen big/ --train 1024 --test 128 --shape 3x16x16 --classes 10 -q
make_npz_fixtures '
import os
os.mkdir("cifar-10-batches-bin")
def batch(n):
    rec = np.zeros((n, 3073), dtype=np.uint8); rec[:, 0] = np.arange(n) % 10; rec[:, 1:] = r.integers(0, 256, (n, 3072)); return rec.tobytes()
open("cifar-10-batches-bin/data_batch_1.bin", "wb").write(batch(50))
open("cifar-10-batches-bin/test_batch.bin", "wb").write(batch(20))
neuro = {f"{k}_{s}": v for s, n in (("train", 256), ("test", 64)) for k, v in (
    ("stim", r.normal(size=(n, 1, 6, 6)).astype(np.float32)), ("robs", r.poisson(1.5, (n, 12)).astype(np.float32)),
    ("behavior", r.normal(size=(n, 4)).astype(np.float32)))}
np.savez("neuro.npz", **neuro)
n = 64
np.savez("chess.npz", positions=r.integers(-1, 2, (n, 12, 8, 8)).astype(np.int8),
         moves=r.integers(0, 4672, n).astype(np.int32), results=r.integers(-1, 2, n).astype(np.int8))
for rec in ("rec1", "rec2"):
    np.savez(rec + ".npz", stim=r.integers(0, 256, (n, 1, 36, 36)).astype(np.uint8),
             robs=r.random((n, 120), dtype=np.float32), behavior=r.random((n, 4), dtype=np.float32))
'
dsbench all data/ --cases io.seq --repetitions 1 --min-time 0 --json before.json -q >/dev/null && cp before.json after.json

ran=0
for line in "${LINES[@]}"; do
    run_doc_line "$line" && ran=$((ran + 1))
done
echo "ran $ran README lines"

# Twice in a row: the bench-then-train line again, over its own results.
again=$(printf '%s\n' "${LINES[@]}" | grep -F 'dsbench all big/ --json b.json')
expect_true "README has the bench-then-train line" test -n "$again"
expect_exit 0 bash -c "$(rewrite "$again")"

finish
