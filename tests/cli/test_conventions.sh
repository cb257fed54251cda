#!/usr/bin/env bash
# What every tool shares (lib/src/cli.cpp, output.cpp, signals.cpp): one rule
# for -q (notes and progress on stderr silenced, stdout never), a suggestion
# for a mistyped option, numeric ranges checked at parse time (exit 2), and
# dstrain's device and data checks: --precision on the CPU says what runs,
# --device cuda:N without a usable GPU is exit 3, non-finite data is exit 1.
source "$(dirname "$0")/lib.sh"
for t in dsgen dsconvert dsplan dsbench dstrain; do [ -x "$BIN/$t" ] || skip "no $t binary in $BIN"; done
G="$BIN/dsgen"
D="$BIN/dsconvert"
T="$BIN/dstrain"

# -q: nothing on stderr for a successful run; results stay on stdout.
expect_exit 0 "$G" "$WORK/a" --train 600 --test 200 --shape 1x8x8 --classes 4 -q
expect_no_stdout
expect_true "dsgen -q: empty stderr" test ! -s "$ERR"
expect_exit 0 "$G" "$WORK/j" --train 100 --test 0 --shape 1x8x8 -q --json
expect_stdout '"samples": 100'
expect_exit 0 "$D" "$WORK/a" "$WORK/b" --dtype f32 -q
expect_no_stdout
expect_true "dsconvert -q: empty stderr" test ! -s "$ERR"
expect_exit 0 "$D" --verify "$WORK/b" -q
expect_stdout 'OK'
expect_exit 0 "$BIN/dsplan" --ram 16G --disk 100G --gpu-mem 8G --shape 3x32x32 --dtype u8 -q
expect_stdout 'capacity'
expect_true "dsplan -q: empty stderr" test ! -s "$ERR"
expect_exit 0 "$T" "$WORK/a" --device cpu -T 1 --model mlp:16 --epochs 1 --batch 50 -q
expect_stdout '^epoch 1/1 '
expect_true "dstrain -q: empty stderr" test ! -s "$ERR"
# Without -q the same runs say what they did on stderr.
expect_exit 0 "$G" "$WORK/c" --train 100 --test 0 --shape 1x8x8
expect_stderr '^dsgen: 100 samples'
expect_no_stdout

# A mistyped option names the nearest one, in every tool.
expect_exit 2 "$G" "$WORK/x" --trian 10K
expect_stderr "unknown option '--trian' \(did you mean '--train'\?\)"
expect_exit 2 "$D" "$WORK/a" "$WORK/y" --dtyp bf16
expect_stderr "unknown option '--dtyp' \(did you mean '--dtype'\?\)"
expect_exit 2 "$BIN/dsplan" --shpe 3x32x32
expect_stderr "did you mean '--shape'"
expect_exit 2 "$BIN/dsbench" --lsit
expect_stderr "did you mean '--list'"
expect_exit 2 "$T" "$WORK/a" --momentm 0.5
expect_stderr "did you mean '--momentum'"
# A real option under the wrong subcommand is named as such, not "did you mean" itself.
expect_exit 2 "$T" eval "$WORK/a" --weights "$WORK/w" --epochs 1
expect_stderr "option '--epochs' does not apply here \(it is an option of 'dstrain'\)"
expect_exit 2 "$T" "$WORK/a" --zzzzzzzz 1
expect_stderr "unknown option '--zzzzzzzz'"
expect_true "no suggestion for a name far from every option" bash -c "! grep -q 'did you mean' '$ERR'"
# An argument that is no option is named; dsplan, which takes its dataset by
# option, says how to name one typed as the other tools take it, and dsbench
# that a subcommand comes first.
expect_exit 2 "$BIN/dsplan" "$WORK/a"
expect_stderr "unexpected argument '$WORK/a' \(name a dataset with --dataset $WORK/a\)"
expect_exit 2 "$G" "$WORK/x" "$WORK/y" --train 10
expect_stderr "^dsgen: error: unexpected argument '$WORK/y'$"
expect_exit 2 "$BIN/dsbench" "$WORK/a"
expect_stderr "unexpected argument '$WORK/a' \(dsbench takes a subcommand first: all, compare\)"

# Numeric ranges, checked before anything runs (exit 2, naming the option).
for bad in "--momentum 5" "--momentum -0.1" "--weight-decay nan" "--gamma nan" "--gamma 0" "--lr 0" "--lr inf" "--lr -1" \
    "--label-smoothing 1" "--warmup-epochs -1"; do
    # shellcheck disable=SC2086
    expect_exit 2 "$T" "$WORK/a" --device cpu $bad
    expect_stderr "^dstrain: error: ${bad%% *}"
done

# Non-finite values of the other tools' float options.
expect_exit 2 "$D" "$WORK/a" "$WORK/n1" --dtype f32 --offset nan
expect_stderr "--offset: nan is not a finite number"
expect_exit 2 "$D" "$WORK/a" "$WORK/n2" --dtype f32 --scale inf
expect_stderr "--scale: inf is not a finite number"
expect_exit 2 "$BIN/dsbench" all "$WORK/a" --min-time nan
expect_stderr "--min-time: nan is not a finite number"
expect_exit 2 "$G" "$WORK/n3" --noise nan
expect_exit 2 "$G" "$WORK/n4" --classes 0

# --precision on the CPU: the CPU computes fp32, and the run says so.
expect_exit 0 "$T" "$WORK/a" --device cpu -T 1 --model mlp:16 --epochs 1 --batch 50 --precision bf16 --json
expect_stderr 'applies to the GPU; the CPU computes fp32'
expect_stderr 'device cpu, fp32'
expect_true "--json says fp32" grep -q '"precision": "fp32"' "$OUT"

# --device cuda:0 without a usable GPU: exit 3, the cause and what to do.
if ! nvidia-smi -L >/dev/null 2>&1; then
    expect_exit 3 "$T" "$WORK/a" --device cuda:0 --epochs 1
    expect_stderr '^dstrain: error: --device cuda:0.*(built without CUDA support|no usable GPU|no NVIDIA (driver or )?GPU|the NVIDIA driver supports).* --device cpu'
fi

# An all-NaN f32 dataset is bad data: exit 1 naming the sample and field
# (a dsgen dataset overwritten with NaN, its manifest without statistics, as
# dsconvert writes it from a .npy file).
py=$(numpy_python)
if [ -n "$py" ]; then
    "$G" "$WORK/nan" --train 64 --test 16 --shape 1x4x4 --dtype f32 --classes 2 -q
    "$py" -c '
import json, sys
import numpy as np
d = sys.argv[1]
for f in ("train_x", "test_x"):
    a = np.load(d + "/" + f + ".npy", mmap_mode="r+")
    a[:] = np.nan
    a.flush()
m = json.load(open(d + "/dataset.json"))
m.pop("stats", None)
json.dump(m, open(d + "/dataset.json", "w"))
' "$WORK/nan"
    expect_exit 1 "$T" "$WORK/nan" --device cpu -T 1 --model mlp:8 --epochs 1 --batch 16
    expect_stderr "field 'x' sample 0 holds a non-finite value \(NaN"
fi

finish
