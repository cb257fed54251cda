#!/usr/bin/env bash
# Data-parallel dstrain on the CPU under mpirun: N ranks with --batch B train
# the same global batches (same sample indices per global step) as one
# process with --batch N*B, to float tolerance in the weights, bitwise between
# runs of the same N; a checkpoint resumes at the same N bitwise and at
# another N (uneven: 3 ranks); a rank that never starts ends the others with a
# message naming it, within --dist-timeout.
source "$(dirname "$0")/lib.sh"
DSTRAIN="$BIN/dstrain"
DSGEN="$BIN/dsgen"
[ -x "$DSTRAIN" ] || skip "no dstrain binary in $BIN"
[ -x "$DSGEN" ] || skip "no dsgen binary in $BIN"
command -v mpirun >/dev/null 2>&1 || skip "no mpirun (install openmpi-bin: scripts/setup.sh)"
command -v python3 >/dev/null 2>&1 || skip "no python3 (to compare weights)"

# CI runs as root in a container with 2 cores: Open MPI refuses root and more
# ranks than cores unless told; shared-memory single-copy needs ptrace rights
# containers lack.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --oversubscribe --bind-to none)
cd "$WORK" || exit 1 # runs without --save leave model.safetensors here

# A build without MPI says so (exit 2) when a launcher starts several ranks.
"$DSGEN" "$WORK/ds" --train 500 --test 64 --shape 1x6x6 --classes 4 --seed 3 -q >/dev/null ||
    { echo "dsgen failed" >&2; exit 1; }
RUN=(--model mlp:16 --device cpu --epochs 2 -T 1 --order chunk --chunk-samples 50 --window 2 --seed 5 --lr 0.02)
expect_exit 2 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 48 --dist-timeout 0
expect_stderr -- '--dist-timeout: 0 is outside'
if ! "${MPIRUN[@]}" -np 2 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 24 --max-steps 1 -q >"$OUT" 2>"$ERR"; then
    if grep -q "built without MPI" "$ERR"; then
        expect_exit 2 "${MPIRUN[@]}" -np 2 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 24 -q
        expect_stderr 'this dstrain was built without MPI'
        finish
    fi
    fail "mpirun -np 2 dstrain failed"
    finish
fi

# max |a - b| / (1 + |a|) over every tensor of two safetensors files, under
# 1e-5 (or at most the third argument: 0 for bit-equal).
weights_close() {
    python3 - "$1" "$2" "${3:-1e-5}" <<'PY'
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        out[name] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out
x, y = tensors(sys.argv[1]), tensors(sys.argv[2])
assert x.keys() == y.keys() and x, "different tensors"
worst = max(abs(p - q) / (1 + abs(p)) for k in x for p, q in zip(x[k], y[k]))
tol = float(sys.argv[3])
sys.exit(0 if (worst <= tol if tol == 0 else worst < tol) else print("largest relative difference", worst) or 1)
PY
}
# The per-step hashes of the global batches' sample indices in a --log-json file.
index_hashes() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("event") == "epoch":
        print(j["epoch"], j["first_batch"], " ".join(j["index_hashes"]))' "$1"; }
state_of() {
    local file=$1/checkpoint.dstk n
    n=$(grep -ao '"state_bytes": *[0-9]*' "$file" | grep -o '[0-9]*$')
    tail -c "$n" "$file"
}

# One process, global batch 48; 2 ranks of 24 (twice); 3 ranks of 16, streamed.
expect_exit 0 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 48 --save "$WORK/n1.safetensors" --log-json "$WORK/n1.jsonl" -q
expect_exit 0 "${MPIRUN[@]}" -np 2 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 24 --save "$WORK/n2.safetensors" \
    --log-json "$WORK/n2.jsonl" --checkpoint "$WORK/ck2"
CHECKS=$((CHECKS + 1))
[ "$(grep -c '^epoch ' "$OUT")" -eq 2 ] || fail "2 ranks: expected rank 0's 2 epoch lines alone on stdout"
expect_stderr 'data parallel: 2 ranks \(Open MPI\), global batch 48 = 2 x 24'
expect_exit 0 "${MPIRUN[@]}" -np 2 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 24 --save "$WORK/n2b.safetensors" -q
expect_same "$WORK/n2.safetensors" "$WORK/n2b.safetensors"
expect_exit 0 "${MPIRUN[@]}" -np 3 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 16 --data stream \
    --save "$WORK/n3.safetensors" --log-json "$WORK/n3.jsonl" -q
expect_true "2 ranks: weights equal to one process's (float tolerance)" weights_close "$WORK/n1.safetensors" "$WORK/n2.safetensors"
expect_true "3 ranks: weights equal to one process's (float tolerance)" weights_close "$WORK/n1.safetensors" "$WORK/n3.safetensors"
# A launcher's world of one takes the distributed path (MPI, the reducer at
# N = 1): the same weights bit for bit and the same batches as a plain run.
expect_exit 0 "${MPIRUN[@]}" -np 1 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 48 --save "$WORK/m1.safetensors" \
    --log-json "$WORK/m1.jsonl"
expect_stderr 'data parallel: 1 rank \(Open MPI\), global batch 48 = 1 x 48, gradients averaged with MPI'
expect_true "mpirun -np 1: weights bit-equal to a plain run's" weights_close "$WORK/n1.safetensors" "$WORK/m1.safetensors" 0
index_hashes "$WORK/m1.jsonl" >"$WORK/m1.hashes"
index_hashes "$WORK/n1.jsonl" >"$WORK/n1.hashes"
expect_same "$WORK/n1.hashes" "$WORK/m1.hashes"
index_hashes "$WORK/n2.jsonl" >"$WORK/n2.hashes"
index_hashes "$WORK/n3.jsonl" >"$WORK/n3.hashes"
expect_true "index hashes logged: 2 epochs of 10 steps" test "$(wc -w <"$WORK/n1.hashes")" -eq 24
expect_same "$WORK/n1.hashes" "$WORK/n2.hashes"
expect_same "$WORK/n1.hashes" "$WORK/n3.hashes"

# Stopped after 7 of 20 global steps, resumed at 2 ranks: bitwise the whole run.
expect_exit 0 "${MPIRUN[@]}" -np 2 "$DSTRAIN" "$WORK/ds" "${RUN[@]}" --batch 24 --checkpoint "$WORK/stop" --max-steps 7 -q
cp -r "$WORK/stop" "$WORK/stop3"
cp -r "$WORK/stop" "$WORK/stop1"
expect_exit 0 "${MPIRUN[@]}" -np 2 "$DSTRAIN" --checkpoint "$WORK/stop" --resume -q
state_of "$WORK/ck2" >"$WORK/ck2.state"
state_of "$WORK/stop" >"$WORK/stop.state"
expect_same "$WORK/ck2.state" "$WORK/stop.state"
# ... and at 3 ranks: --batch 16 from the checkpoint's global batch, the same
# global steps from step 8 on.
expect_exit 0 "${MPIRUN[@]}" -np 3 "$DSTRAIN" --checkpoint "$WORK/stop3" --resume --log-json "$WORK/r3.jsonl" \
    --save "$WORK/r3.safetensors"
expect_stderr 'global batch 48 = 3 x 16'
expect_stderr 'resumed from .* at epoch 1, batch 7 \(step 7\)'
expect_true "resumed at 3 ranks: weights equal to the whole run's (float tolerance)" \
    weights_close "$WORK/n2.safetensors" "$WORK/r3.safetensors"
index_hashes "$WORK/r3.jsonl" >"$WORK/r3.hashes"
expect_true "resumed at 3 ranks: the same global batches from step 8 on" test \
    "$(head -1 "$WORK/r3.hashes" | cut -d' ' -f3-)" = "$(head -1 "$WORK/n1.hashes" | cut -d' ' -f10-)"
expect_true "resumed at 3 ranks: the same global batches in epoch 2" test \
    "$(sed -n 2p "$WORK/r3.hashes")" = "$(sed -n 2p "$WORK/n1.hashes")"
# ... and at 1 rank (a launcher's world of one): --batch 48.
expect_exit 0 "${MPIRUN[@]}" -np 1 "$DSTRAIN" --checkpoint "$WORK/stop1" --resume --save "$WORK/r1.safetensors"
expect_stderr 'global batch 48 = 1 x 48'
expect_true "resumed at 1 rank: weights equal to the whole run's (float tolerance)" \
    weights_close "$WORK/n2.safetensors" "$WORK/r1.safetensors"
# 5 ranks cannot split the global batch 48.
cp -r "$WORK/ck2" "$WORK/ck5"
expect_exit 2 "${MPIRUN[@]}" -np 5 "$DSTRAIN" --checkpoint "$WORK/ck5" --resume --epochs 3 -q
expect_stderr 'with 5 ranks \(its global batch 48 = ranks x --batch does not split into 5 equal batches\)'

# SIGTERM to mpirun mid-run (of a run far from its end): every rank stops
# after the same step, rank 0's checkpoint is in place before any rank exits;
# it resumes at 4 ranks.
"$DSGEN" "$WORK/cnn" --train 4000 --test 64 --shape 1x12x12 --classes 4 --seed 3 -q >/dev/null
"${MPIRUN[@]}" -np 2 "$DSTRAIN" "$WORK/cnn" --model small-cnn --device cpu --epochs 30 -T 1 --batch 32 \
    --checkpoint "$WORK/term" -q >"$WORK/term.out" 2>"$WORK/term.err" &
pid=$!
sleep 3
kill -TERM "$pid" 2>/dev/null
wait "$pid"
grep -o 'interrupted at epoch [0-9]*, step [0-9]*; checkpoint written' "$WORK/term.err" | sort -u >"$WORK/term.steps"
step=$(grep -o '[0-9]*;' "$WORK/term.steps" | tr -d ';' | head -1)
expect_true "SIGTERM: both ranks stopped after the same step, with a checkpoint: $(cat "$WORK/term.err")" \
    test "$(grep -c . "$WORK/term.steps")" -eq 1 -a -f "$WORK/term/checkpoint.dstk"
if [ -n "$step" ]; then
    expect_exit 0 "${MPIRUN[@]}" -np 4 "$DSTRAIN" --checkpoint "$WORK/term" --resume --max-steps $((step + 3))
    expect_stderr 'global batch 64 = 4 x 16'
    expect_stderr "resumed from .* \\(step $step\\)"
    expect_stdout '^epoch [0-9]+/30 \(part\)'
fi

# Rank 1 never starts dstrain: rank 0 ends with exit 1 within the timeout, naming it.
# Its arrival mark stays (another rank's watchdog may read it): in $WORK, not /tmp.
start=$(date +%s)
TMPDIR=$WORK expect_exit 1 "${MPIRUN[@]}" -np 2 sh -c \
    'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then sleep 60; fi; exec "$0" "$@"' "$DSTRAIN" "$WORK/ds" "${RUN[@]}" \
    --batch 24 --dist-timeout 3 -q
elapsed=$(($(date +%s) - start))
expect_stderr 'rank 0 of 2: MPI_Init did not complete within --dist-timeout 3 s \(it waits for every rank\): rank\(s\) 1 never started dstrain'
expect_true "the missing rank's error came within the timeout (took ${elapsed} s)" test "$elapsed" -lt 30
finish
