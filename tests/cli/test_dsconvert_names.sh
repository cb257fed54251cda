#!/usr/bin/env bash
# Split and field names become file names (SPLIT_FIELD.npy in OUTPUT): a name
# that leads out of OUTPUT ('../x', '/abs/x', 'a/b') or that no file can have
# (empty, '.', '..', over 100 bytes, a control character) is refused where it
# enters: in an option a usage error (exit 2), in an input (dataset.json, an
# .npz member) a corrupt input (exit 1). Samples of no element (a 0
# dimension) are refused before any work too (exit 1). Each time nothing is
# written outside OUTPUT and nothing is left behind. No numpy needed: the
# hostile files are written byte by byte.
. "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
G="$BIN/dsgen"
for t in "$D" "$G"; do [ -x "$t" ] || skip "no $(basename "$t") binary in $BIN"; done
command -v python3 >/dev/null || skip "python3 is needed to write the hostile files"
# The outputs go to $WORK/t, so that '..' is $WORK, still watched.
mkdir -p "$WORK/t" && cd "$WORK/t" || exit 1
"$G" d --train 300 --test 100 --shape 1x8x8 -q || { echo "dsgen failed" >&2; exit 1; }
echo precious >victim_x.npy

# Every file under $WORK with its checksum (but the captured output).
snapshot() { (cd "$WORK" && find . -name .stdout -prune -o -name .stderr -prune -o -print | sort | while read -r f; do
    if [ -f "$f" ]; then echo "$f $(cksum <"$f")"; else echo "$f"; fi
done); }
BEFORE=$(snapshot)
# unchanged WHAT: the last command wrote nothing anywhere.
unchanged() { expect_true "$1: nothing written, nothing left behind" test "$(snapshot)" = "$BEFORE"; }

# ---- names in options: exit 2 before any work --------------------------
expect_exit 2 "$D" d out --split '../victim=0.5,test=0.5' -q
expect_stderr "invalid --split: split name '\.\./victim' holds a '/'"
unchanged "--split ../victim"
expect_exit 2 "$D" d out --split "$WORK/abs=0.5,test=0.5" -q
expect_stderr "holds a '/'"
unchanged "--split /abs"
expect_exit 2 "$D" d out --split '../leak=0.5,bad/x=0.5' -q
unchanged "--split ../leak,bad/x"
expect_exit 2 "$D" d out --split '..=0.5,test=0.5' -q
expect_stderr "split name '\.\.' is a directory name"
expect_exit 2 "$D" d out --split '.=0.5,test=0.5' -q
expect_stderr "split name '\.' is a directory name"
expect_exit 2 "$D" d out --split "$(printf 'a\tb')=0.5,test=0.5" -q
expect_stderr "split name 'a\\\\x09b' holds a control character"
long=$(printf 'n%.0s' $(seq 101))
expect_exit 2 "$D" d out --split "$long=0.5,test=0.5" -q
expect_stderr "is 101 bytes long, more than 100"
expect_exit 0 "$D" d out100 --split "${long:1}=0.5,test=0.5" -q
expect_file "out100/${long:1}_x.npy"
rm -rf out100
expect_exit 2 "$D" d out --dtype '../x=f32' -q
expect_stderr "invalid --dtype: field name '\.\./x' holds a '/'"
expect_exit 2 "$D" d out.npy --select '../x' -q
expect_stderr "invalid --select: split name '\.\.' is a directory name"
expect_exit 2 "$D" d out.npy --select 'train/a/b' -q
expect_stderr "invalid --select: field name 'a/b' holds a '/'"
expect_exit 2 "$D" d out --input '../x' -q
expect_stderr "invalid --input: field name"
unchanged "the other options"

# ---- names in a dataset.json: a corrupt input, exit 1 ------------------
# edit_manifest DIR PYTHON: a copy of d whose manifest `j` PYTHON changes.
edit_manifest() {
    rm -rf "$1" && cp -r d "$1"
    python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
exec(sys.argv[2])
open(sys.argv[1], "w").write(json.dumps(j))' "$1/dataset.json" "$2"
}
edit_manifest evil_split 'j["splits"][0]["name"] = "../evil"'
edit_manifest evil_field 'j["input_field"] = "../evilf"
for s in j["splits"]: s["fields"][0]["name"] = "../evilf"'
BEFORE=$(snapshot)
expect_exit 1 "$D" evil_split out -q
expect_stderr "evil_split/dataset.json: splits\[0\]\.name: split name '\.\./evil' holds a '/'"
unchanged "a manifest's split ../evil"
expect_exit 1 "$D" --verify evil_split -q
expect_stderr "split name '\.\./evil'"
expect_exit 1 "$D" evil_field out -q
expect_stderr "evil_field/dataset.json: splits\[0\]\.fields\[0\]\.name: field name '\.\./evilf' holds a '/'"
expect_exit 1 "$D" --verify evil_field -q
expect_exit 1 "$BIN/dsplan" --dataset evil_split -q
expect_stderr "split name '\.\./evil'"
unchanged "a manifest's field ../evilf"

# ---- names and shapes in array files: a corrupt input, exit 1 ----------
# .npy, .npz and IDX files of the given shapes, zero-filled (the IDX reader
# refuses a 0 dimension itself).
python3 - <<'PY'
import struct, zipfile
def npy(shape):
    h = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (shape,)
    h = h.ljust(117) + "\n"
    n = 1
    for d in shape: n *= d
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + bytes(4 * n)
open("zw.npy", "wb").write(npy((300, 0)))
open("zw4.npy", "wb").write(npy((300, 1, 0, 8)))
with zipfile.ZipFile("zw.npz", "w") as z:
    z.writestr("x.npy", npy((300, 0)))
with zipfile.ZipFile("evil.npz", "w") as z:
    z.writestr("x.npy", npy((300, 4)))
    z.writestr("../evilm.npy", npy((300, 4)))
# IDX: u8 images of 300 x 0 x 28.
open("zw-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, 300, 0, 28))
PY
BEFORE=$(snapshot)
expect_exit 1 "$D" zw.npy out -q
expect_stderr "'zw\.npy': field x has samples of shape 0, which hold no element"
expect_exit 1 "$D" zw4.npy out -q
expect_stderr "'zw4\.npy': field x has samples of shape 1x0x8"
expect_exit 1 "$D" zw.npz out -q
expect_stderr "'zw\.npz': field x has samples of shape 0"
expect_exit 1 "$D" zw-images-idx3-ubyte out -q
expect_stderr "zw-images-idx3-ubyte: IDX dimension 1 is 0"
expect_exit 1 "$D" evil.npz out -q
expect_stderr "'evil\.npz': the input's field name '\.\./evilm' holds a '/'"
unchanged "zero-sized samples and a member ../evilm.npy"
# A raw input's --shape cannot hold a 0: a usage error, as in dsgen.
expect_exit 2 "$D" zw.npy out --from raw --in-dtype f32 --shape 1x0x8 -q
expect_stderr "invalid --shape '1x0x8'"
expect_exit 2 "$G" z0 --train 10 --test 0 --shape 1x0x8 -q
expect_stderr "invalid --shape '1x0x8'"
unchanged "--shape 1x0x8"

finish
