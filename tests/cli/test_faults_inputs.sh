#!/usr/bin/env bash
# Nothing hangs, nothing is silent (issue 27, cases 8-12): JSON nested
# deeper than 64 levels is refused, not recursed into (manifests, model
# headers, bench results, checkpoints); a FIFO or device named as an input
# is refused at once (every command runs under `timeout`: a hang fails the
# check); statistics that cannot normalise, encrypted npz members and
# arguments that are not UTF-8 get a message before any work.
source "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
DSGEN="$BIN/dsgen"
DSPLAN="$BIN/dsplan"
DSBENCH="$BIN/dsbench"
DSTRAIN="$BIN/dstrain"
for t in "$D" "$DSGEN" "$DSPLAN" "$DSBENCH" "$DSTRAIN"; do [ -x "$t" ] || skip "no $(basename "$t") binary in $BIN"; done
command -v python3 >/dev/null || skip "python3 is needed to write the hostile files"
cd "$WORK"

# t CODE cmd...: expect_exit under a 20 s timeout (a hang exits 124).
t() {
    local want=$1
    shift
    expect_exit "$want" timeout 20 "$@"
}

"$DSGEN" ds --train 128 --test 32 --shape 1x4x4 --classes 2 --seed 3 -q >/dev/null || { echo "dsgen failed" >&2; exit 1; }
TRAIN=(--model flatten,fc:2 --device cpu -T 1 --epochs 1 --batch 32 -q)
t 0 "$DSTRAIN" ds "${TRAIN[@]}" --save m.safetensors --checkpoint ck
t 0 "$DSBENCH" all ds --cases 'io.seq.pread.warm' --json bench.json -q

# edit_json FILE PYTHON: FILE's JSON as `j`, PYTHON changes it, written back.
edit_json() {
    python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
exec(sys.argv[2])
open(sys.argv[1], "w").write(json.dumps(j))' "$1" "$2"
}
# deep_copy DIR LEVELS: a copy of ds whose provenance.params.deep is LEVELS
# nested arrays (the whole document then LEVELS + 3 deep).
deep_copy() {
    rm -rf "$1" && cp -r ds "$1"
    python3 -c 'import sys
p = sys.argv[1] + "/dataset.json"
t = open(p).read()
n = int(sys.argv[2])
t = t.replace("\"params\": {", "\"params\": {\"deep\": " + "[" * n + "]" * n + ", ", 1)
open(p, "w").write(t)' "$1" "$2"
}

# ---- 8. JSON nested deeper than 64 levels: refused, never a stack overflow --
deep_copy deep 100000
for cmd in "$D --verify deep" "$DSPLAN --dataset deep" "$D deep deep_out" "$DSTRAIN deep ${TRAIN[*]}" \
    "$DSBENCH all deep --cases io.seq.pread.warm"; do
    t 1 $cmd
    expect_stderr "deep/dataset.json: not valid JSON \(arrays or objects nested more than 64 deep, the most dstk reads\)"
done
expect_no_file deep_out
# The limit is 64 levels: 64 are read, 65 are not.
deep_copy deep64 61
t 0 "$D" --verify deep64
deep_copy deep65 62
t 1 "$D" --verify deep65
expect_stderr "nested more than 64 deep"
# A model whose safetensors header is nested too deep.
python3 -c 'import struct
h = b"[" * 100000 + b"]" * 100000
open("deep.safetensors", "wb").write(struct.pack("<Q", len(h)) + h)'
t 1 "$DSTRAIN" eval ds --weights deep.safetensors --device cpu
expect_stderr "deep.safetensors.*nested more than 64 deep"
t 1 "$DSTRAIN" ds "${TRAIN[@]}" --init-from deep.safetensors
expect_stderr "nested more than 64 deep"
# dsbench results (dsplan --bench, dsbench compare).
python3 -c 'open("deepbench.json", "w").write("{\"schema_version\": " + "[" * 100000 + "]" * 100000 + "}")'
t 1 "$DSPLAN" --shape 1x4x4 --dtype u8 --bench deepbench.json
expect_stderr "deepbench.json: not a dsbench results file .*nested more than 64 deep"
t 1 "$DSBENCH" compare bench.json deepbench.json
expect_stderr "nested more than 64 deep"
# A checkpoint whose header is nested too deep.
mkdir ckdeep
python3 -c 'import struct
h = b"[" * 100000 + b"]" * 100000
open("ckdeep/checkpoint.dstk", "wb").write(b"DSTKCKP1" + struct.pack("<Q", len(h)) + h)'
t 1 "$DSTRAIN" --checkpoint ckdeep --resume
expect_stderr "checkpoint.dstk: header: .*nested more than 64 deep"

# ---- 9. a FIFO (or device) named as an input: refused, never waited on ----
rm -rf fifods && cp -r ds fifods
rm fifods/train_x.npy && mkfifo fifods/train_x.npy
for cmd in "$D --verify fifods" "$DSPLAN --dataset fifods" "$D fifods fifo_out" "$DSTRAIN fifods ${TRAIN[*]}" \
    "$DSBENCH all fifods --cases io.seq.pread.warm"; do
    t 1 $cmd
    expect_stderr "cannot read .*fifods/train_x.npy' \(it is a FIFO, not a regular file"
done
expect_no_file fifo_out
rm -rf fifoman && cp -r ds fifoman
rm fifoman/dataset.json && mkfifo fifoman/dataset.json
t 1 "$D" --verify fifoman
expect_stderr "cannot read manifest .*dataset.json' \(it is a FIFO"
mkfifo w.safetensors
t 1 "$DSTRAIN" eval ds --weights w.safetensors --device cpu
expect_stderr "cannot read model 'w.safetensors' \(it is a FIFO"
t 1 "$DSTRAIN" predict ds --weights w.safetensors --device cpu
expect_stderr "it is a FIFO"
t 1 "$DSTRAIN" ds "${TRAIN[@]}" --init-from w.safetensors
expect_stderr "cannot read model 'w.safetensors' \(it is a FIFO"
mkfifo b.json
t 1 "$DSPLAN" --shape 1x4x4 --dtype u8 --bench b.json
expect_stderr "cannot read benchmark results 'b.json' \(it is a FIFO"
t 1 "$DSBENCH" compare bench.json b.json
expect_stderr "it is a FIFO"
mkfifo in.npy
t 1 "$D" in.npy fifo_out
expect_stderr "cannot read input 'in.npy' \(it is a FIFO.*data from a pipe goes to stdin, '-'"
t 1 "$D" in.npy fifo_out --from raw --shape 16 --in-dtype u8
expect_stderr "it is a FIFO"
t 1 "$DSTRAIN" predict in.npy --weights m.safetensors --device cpu
expect_stderr "cannot read input 'in.npy' \(it is a FIFO"
t 1 "$DSBENCH" all in.npy --sample-bytes 16
expect_stderr "cannot read benchmark target 'in.npy' \(it is a FIFO"
t 1 "$D" /dev/zero fifo_out --from raw --shape 16 --in-dtype u8
expect_stderr "it is a character device"
expect_no_file fifo_out
# Where a pipe is expected ('-'), it is read.
CHECKS=$((CHECKS + 1))
head -c 1600 /dev/urandom >x.raw
cat x.raw | timeout 20 "$D" - pipe_out.raw --from raw --shape 16 --in-dtype u8 --to raw -q 2>"$ERR" ||
    fail "a pipe on stdin ('-') is still read"
expect_same pipe_out.raw x.raw

# ---- 10. statistics that cannot normalise ---------------------------------
for bad in "0" "-1.5"; do
    rm -rf std0 && cp -r ds std0
    edit_json std0/dataset.json "j['stats']['std'][0] = $bad"
    t 1 "$DSTRAIN" std0 "${TRAIN[@]}"
    expect_stderr "std0/dataset.json: stats.std\[0\]: $bad cannot normalise channel 0 \(the input is divided by it"
    expect_stderr "remove \"stats\" so that dstrain computes them from the data"
    t 1 "$D" --verify std0
    expect_stderr "stats.std\[0\]"
done
# A field's own statistics are held to the same rule.
rm -rf std0f && cp -r ds std0f
edit_json std0f/dataset.json "
for f in j['splits'][0]['fields']:
    if 'stats' in f: f['stats']['std'][0] = 0
del j['stats']"
t 1 "$DSTRAIN" std0f "${TRAIN[@]}"
expect_stderr "std0f/dataset.json: splits\[0\].fields\[0\].stats.std\[0\]: 0 cannot normalise"
edit_json std0/dataset.json "
del j['stats']
for s in j['splits']:
    for f in s['fields']: f.pop('stats', None)"
t 0 "$DSTRAIN" std0 "${TRAIN[@]}" --save std0.safetensors
# A constant channel: dsgen writes no statistics it could not read back.
t 0 "$DSGEN" const --train 1 --test 1 --shape 1x1x1 --classes 2 --noise 0 -q
expect_true "no stats for a constant channel" python3 -c 'import json, sys
sys.exit("stats" in json.load(open("const/dataset.json")))'
t 0 "$DSTRAIN" const --model flatten,fc:2 --device cpu --epochs 1 --batch 1 -q --save const.safetensors

# ---- 11. encrypted npz members are named as such --------------------------
# encrypted_npz FILE HOW: a stored npz member x.npy, marked encrypted by the
# general-purpose flag (PKWARE) or by method 99 (AES).
encrypted_npz() {
    python3 -c 'import struct, sys, zipfile
header = b"{\x27descr\x27: \x27|u1\x27, \x27fortran_order\x27: False, \x27shape\x27: (4, 2), }"
header += b" " * (118 - len(header)) + b"\n"
npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(range(8))
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_STORED) as z:
    z.writestr("x.npy", npy)
b = bytearray(open(sys.argv[1], "rb").read())
local, central = b.find(b"PK\x03\x04"), b.find(b"PK\x01\x02")
if sys.argv[2] == "pkware":
    b[local + 6] |= 1
    b[central + 8] |= 1
else:
    b[local + 8:local + 10] = struct.pack("<H", 99)
    b[central + 10:central + 12] = struct.pack("<H", 99)
open(sys.argv[1], "wb").write(bytes(b))' "$1" "$2"
}
for how in pkware aes; do
    encrypted_npz "enc_$how.npz" "$how"
    t 1 "$D" "enc_$how.npz" enc_out
    expect_stderr "enc_$how.npz:x.npy: is encrypted \(a password-protected archive\)"
    expect_no_file enc_out
done

# ---- 12. arguments that are not UTF-8: refused before any work ------------
bad=$'g\xe9'
t 2 "$DSGEN" "$bad" --train 64 --shape 1x2x2
expect_stderr "argument 'g\\\\xE9' is not valid UTF-8"
t 2 "$D" ds/train_x.npy "$bad.npy"
expect_stderr "not valid UTF-8"
t 2 "$D" ds "$WORK/$bad"
t 2 "$DSTRAIN" ds "${TRAIN[@]}" --save "$bad.safetensors"
t 2 "$DSTRAIN" ds "${TRAIN[@]}" --log-json "$bad.jsonl"
t 2 "$DSPLAN" --dataset "$bad"
t 2 "$DSBENCH" all "$bad"
expect_stderr "not valid UTF-8"
expect_true "nothing written under a name that is not UTF-8" test -z "$(find . -name "*$bad*")"
expect_no_file model.safetensors
# UTF-8 names beyond ASCII are fine.
t 0 "$DSGEN" "gé" --train 64 --shape 1x2x2 -q
t 0 "$D" --verify "gé"

finish
