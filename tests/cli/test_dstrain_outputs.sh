#!/usr/bin/env bash
# Where dstrain writes is checked before the first step (exit 2, nothing
# trained, nothing written): a --save, --log-json, --checkpoint or
# --tensorboard whose directory is missing or is a file, and two outputs
# naming the same path. Before, each was found only at the end of the run,
# with the model lost or saved under another name.
source "$(dirname "$0")/lib.sh"
G="$BIN/dsgen"
T="$BIN/dstrain"
[ -x "$G" ] && [ -x "$T" ] || skip "no dsgen/dstrain binary in $BIN"

"$G" "$WORK/ds" --train 400 --test 100 --shape 1x8x8 -q
cd "$WORK" || exit 1
RUN=(ds --device cpu -T 1 --model small-cnn --epochs 2 --batch 32)

expect_exit 2 "$T" "${RUN[@]}" --save nodir/m.safetensors
expect_stderr "cannot write --save 'nodir/m.safetensors' \(directory 'nodir' does not exist\); create it, or choose another path"
expect_true "no epoch ran" bash -c "! grep -q 'epoch 1' '$ERR'"
touch afile
expect_exit 2 "$T" "${RUN[@]}" --save afile/m.safetensors
expect_stderr "'afile' is not a directory"
expect_exit 2 "$T" "${RUN[@]}" --log-json nodir/run.jsonl
expect_stderr "cannot write --log-json 'nodir/run.jsonl' \(directory 'nodir' does not exist"
# A checkpoint or TensorBoard directory is created with its parents, but not under a file.
expect_exit 2 "$T" "${RUN[@]}" --checkpoint afile/ck
expect_stderr "cannot write .*'afile/ck/.*' \('afile' is not a directory"
expect_exit 2 "$T" "${RUN[@]}" --tensorboard afile/tb
expect_stderr "cannot write --tensorboard 'afile/tb/' \('afile' is not a directory"

# Two outputs on one path.
expect_exit 2 "$T" "${RUN[@]}" --save a.safetensors --save a.safetensors
expect_stderr "--save 'a.safetensors' and --save 'a.safetensors' name the same path"
expect_exit 2 "$T" "${RUN[@]}" --save a.safetensors --save ./sub/../a.safetensors
expect_stderr "name the same path"
expect_exit 2 "$T" "${RUN[@]}" --save a.safetensors --log-json a.safetensors
expect_stderr "--save 'a.safetensors' and --log-json 'a.safetensors' name the same path"
expect_exit 2 "$T" "${RUN[@]}" --checkpoint ck --log-json ck/checkpoint.dstk
expect_stderr "name the same path"
expect_exit 2 "$T" "${RUN[@]}" --checkpoint ck --log-json ck/model.safetensors
expect_stderr "the model 'ck/model.safetensors' and --log-json 'ck/model.safetensors' name the same path"
expect_exit 2 "$T" "${RUN[@]}" --tensorboard out.safetensors --save out.safetensors
expect_stderr "name the same path"
expect_no_file a.safetensors
expect_no_file ck
expect_no_file out.safetensors
expect_true "no temporary left" test -z "$(find . -name '.*tmp-*')"

# What is allowed still runs: a new checkpoint directory (with its parents),
# the default model in it.
expect_exit 0 "$T" ds --device cpu -T 1 --model small-cnn --epochs 1 --batch 32 --checkpoint new/deep/ck --log-json run.jsonl -q
expect_file new/deep/ck/checkpoint.dstk
expect_file new/deep/ck/model.safetensors
expect_file run.jsonl
finish
