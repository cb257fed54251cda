#!/usr/bin/env bash
# Split and field names become file names (SPLIT_FIELD.npy in OUTPUT): a name
# that leads out of OUTPUT ('../x', '/abs/x', 'a/b') or that no file can have
# (empty, '.', '..', over 100 bytes, a control character) is refused where it
# enters: in an option a usage error (exit 2), in an input (dataset.json, an
# .npz member) a corrupt input (exit 1). Each time nothing is written outside
# OUTPUT and nothing is left behind. No numpy needed: the hostile files are
# written byte by byte.
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

# ---- names in array files: a corrupt input, exit 1 ---------------------
# An .npz with a member ../evilm.npy, written byte by byte.
python3 - <<'PY'
import zipfile
def npy(shape):
    h = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (shape,)
    h = h.ljust(117) + "\n"
    n = 1
    for d in shape: n *= d
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + bytes(4 * n)
with zipfile.ZipFile("evil.npz", "w") as z:
    z.writestr("x.npy", npy((300, 4)))
    z.writestr("../evilm.npy", npy((300, 4)))
PY
BEFORE=$(snapshot)
expect_exit 1 "$D" evil.npz out -q
expect_stderr "'evil\.npz': the input's field name '\.\./evilm' holds a '/'"
unchanged "a member ../evilm.npy"

finish
