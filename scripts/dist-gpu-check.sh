#!/usr/bin/env bash
# On a host with 2 or more GPUs and Open MPI (a multi-GPU kind of the GPU
# machine): data-parallel dstrain over NCCL checked against one process.
#   1. mlp, fp32, --deterministic: one process with --batch 128 and
#      `mpirun -np 2` with --batch 64 train the same global batches (equal
#      index hashes per step in --log-json) to weights equal within 1e-4.
#   2. A 2-rank checkpoint stopped at step 7 resumes in one process (--batch
#      from the checkpoint's global batch) and finishes.
#   3. ref-cnn, bf16, batch 256 per GPU: world samples/s at 1 and N GPUs.
# Needs a build with CUDA and MPI (scripts/gpu-test.sh builds build-gpu/).
# Logs go to LOG_DIR (default $OUT, else build-gpu/dist-logs); a table last.
#   scripts/dist-gpu-check.sh [LOG_DIR]     BIN=build-gpu/bin  NP=2
#   DEVICE=cpu: parts 1 and 2 on CPU ranks (a dry run of this script without GPUs)
set -uo pipefail
cd "$(dirname "$0")/.."
log=${1:-${OUT:-build-gpu/dist-logs}}
bin=${BIN:-build-gpu/bin}
np=${NP:-2}
device=${DEVICE:-cuda}
mkdir -p "$log"
work=$(mktemp -d "${TMPDIR:-/tmp}/dstk-dist.XXXXXX")
trap 'rm -rf "$work"' EXIT
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --bind-to none -x NCCL_NVLS_ENABLE -np "$np")
status=0
table="$log/summary.txt"
: >"$table"
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$table" >/dev/null; }
run() { # run NAME command...: logs to NAME.out / NAME.err, records failures
    local name=$1
    shift
    if ! timeout 240 "$@" >"$log/$name.out" 2>"$log/$name.err"; then
        row "$name" "FAILED (exit $?, see $log/$name.err)"
        status=1
        return 1
    fi
}
hashes() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("event") == "epoch": print(" ".join(j["index_hashes"]))' "$1"; }
worst() { python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: struct.unpack("<%df" % ((t["data_offsets"][1] - t["data_offsets"][0]) // 4),
                             raw[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]])
            for k, t in head.items() if k != "__metadata__" and t["dtype"] == "F32"}
x, y = tensors(sys.argv[1]), tensors(sys.argv[2])
print("%.3g" % max(abs(p - q) / (1 + abs(p)) for k in x for p, q in zip(x[k], y[k])))
PY
}

"$bin/dsgen" "$work/small" --train 5000 --test 500 --shape 1x12x12 --classes 4 --seed 3 -q >/dev/null
det=(--model mlp:64 --device "$device" --precision fp32 --deterministic --epochs 2 --seed 5 --lr 0.05 -q)
g=$((128 / np))
if run one "$bin/dstrain" "$work/small" "${det[@]}" --batch 128 --save "$work/one.safetensors" \
    --log-json "$work/one.jsonl" &&
    run multi "${mpi[@]}" "$bin/dstrain" "$work/small" "${det[@]}" --batch "$g" --save "$work/multi.safetensors" \
        --log-json "$work/multi.jsonl"; then
    if [ "$(hashes "$work/one.jsonl")" = "$(hashes "$work/multi.jsonl")" ]; then
        row "index hashes 1 vs $np ranks" "equal"
    else
        row "index hashes 1 vs $np ranks" "DIFFER"
        status=1
    fi
    w=$(worst "$work/one.safetensors" "$work/multi.safetensors")
    row "weights 1 vs $np ranks (max rel. diff)" "$w"
    python3 -c "import sys; sys.exit(float('$w') >= 1e-4)" || status=1
fi
if run stop "${mpi[@]}" "$bin/dstrain" "$work/small" "${det[@]}" --batch "$g" --checkpoint "$work/ck" --max-steps 7 &&
    run resume1 "$bin/dstrain" --checkpoint "$work/ck" --resume; then
    row "$np-rank checkpoint resumed in 1 process" "$(grep -o 'resumed from .*' "$log/resume1.err" | head -1)"
fi
[ "$device" = cuda ] &&
    "$bin/dsgen" "$work/cifar" --train 50000 --test 1000 --shape 3x32x32 --dtype u8 --classes 10 -q >/dev/null
for p in $([ "$device" = cuda ] && echo bf16); do
    run "ref-1-$p" "$bin/dstrain" "$work/cifar" --batch 256 --epochs 3 --precision "$p" --data device --json -q &&
        run "ref-$np-$p" "${mpi[@]}" "$bin/dstrain" "$work/cifar" --batch 256 --epochs 3 --precision "$p" \
            --data device --json -q &&
        row "ref-cnn $p samples/s: 1 GPU, $np GPUs" "$(python3 -c '
import json, sys
one, many = (json.load(open(f))["epochs"][-1]["samples_per_second"] for f in sys.argv[2:])
print("%.0f  %.0f  (scaling efficiency %.1f%%)" % (one, many, 100 * many / (int(sys.argv[1]) * one)))' \
            "$np" "$log/ref-1-$p.out" "$log/ref-$np-$p.out")"
done
cat "$table"
exit "$status"
