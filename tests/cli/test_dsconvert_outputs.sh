#!/usr/bin/env bash
# What dsconvert writes where, and what its manifest says: a chunk larger
# than the data is clamped to the largest split (not "out of memory"), the
# manifest giving the chunk used; --report-json at OUTPUT or inside it is a
# usage error before any work; num_classes_from stays the same however often
# a dataset is converted again. No numpy needed.
. "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
G="$BIN/dsgen"
for t in "$D" "$G"; do [ -x "$t" ] || skip "no $(basename "$t") binary in $BIN"; done
command -v python3 >/dev/null || skip "python3 is needed to read the manifests"
cd "$WORK" || exit 1
"$G" d --train 300 --test 100 --shape 1x8x8 -q || { echo "dsgen failed" >&2; exit 1; }

# manifest_value DIR PYTHON-EXPRESSION: the expression of the manifest `j`.
manifest_value() {
    python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
print(eval(sys.argv[2]))' "$1/dataset.json" "$2"
}

# ---- a chunk larger than the data: each split is one chunk -------------
for chunk in "--chunk-size 64G" "--chunk-size 100T" "--chunk-samples 1000000000000"; do
    # shellcheck disable=SC2086 # the option and its value
    expect_exit 0 "$D" d c --compress zstd $chunk --force -q
    expect_true "$chunk: train is one chunk of 300 samples" \
        test "$(manifest_value c 'j["splits"][0]["fields"][0]["chunk_samples"]')" = 300
    expect_true "$chunk: the manifest's provenance gives the chunk used" \
        test "$(manifest_value c 'j["provenance"]["params"]["chunk_samples"]')" = 300
    expect_exit 0 "$D" --verify c -q
done
# The clamp is to the largest split: test (100 samples) shares train's 300.
expect_true "test: one (short) chunk of the same size" \
    test "$(manifest_value c 'j["splits"][1]["fields"][0]["chunk_samples"]')" = 300
# The same bytes as a chunk of exactly the largest split.
expect_exit 0 "$D" d c300 --compress zstd --chunk-samples 300 -q
expect_same c/train_x.zst c300/train_x.zst
# --shard parts of a clamped chunk merge into the single run's dataset.
expect_exit 0 "$D" d p0 --compress zstd --chunk-size 64G --shard 0/2 -q
expect_exit 0 "$D" d p1 --compress zstd --chunk-size 64G --shard 1/2 -q
expect_exit 0 "$D" --merge p0 p1 merged -q
expect_same c/train_x.zst merged/train_x.zst

# ---- --report-json may not be OUTPUT or inside it ----------------------
for report in r1 r1/ r1/report.json ./r1/sub/../report.json; do
    expect_exit 2 "$D" d r1 --report-json "$report" -q
    expect_stderr "--report-json '$report' is (OUTPUT itself|inside OUTPUT 'r1')"
    expect_no_file r1
done
expect_stderr "give a path outside OUTPUT, e.g. --report-json .*/r1\.report\.json"
# Through a symbolic link to an existing OUTPUT (a --force run) too.
mkdir -p real && "$D" d real/r2 -q && ln -s real/r2 r2link
expect_exit 2 "$D" d real/r2 --force --report-json r2link/report.json -q
expect_stderr "inside OUTPUT"
expect_exit 2 "$D" --concat d d r3 --report-json r3/report.json -q
expect_stderr "inside OUTPUT"
expect_no_file r3
expect_exit 0 "$D" d r1 --report-json r1.json -q
expect_file r1.json

# ---- num_classes_from is stable across re-conversions ------------------
cp -r d again
from0=$(manifest_value d 'j["provenance"]["params"].get("num_classes_from", "")')
for i in 1 2 3; do
    expect_exit 0 "$D" again again --force -q
    from=$(manifest_value again 'j["provenance"]["params"]["num_classes_from"]')
    expect_true "run $i: num_classes_from '$from' says the input's manifest once" \
        test "$(grep -o "the input's manifest" <<<"$from" | wc -l)" = 1
    [ "$i" = 1 ] && first=$from
    expect_true "run $i: num_classes_from '$from' = the first run's '$first'" test "$from" = "$first"
done
expect_true "dsgen's origin (${from0:-none}) is kept after it" \
    test -z "$from0" -o "$first" = "the input's manifest: $from0"
# An origin of its own (--num-classes) is said once after the input's manifest.
expect_exit 0 "$D" d n1 --num-classes 12 -q
expect_true "--num-classes is the origin" test "$(manifest_value n1 'j["provenance"]["params"]["num_classes_from"]')" = "--num-classes"
for i in 1 2; do
    expect_exit 0 "$D" n1 n1 --force -q
    expect_true "run $i: the input's manifest, then its origin" \
        test "$(manifest_value n1 'j["provenance"]["params"]["num_classes_from"]')" = "the input's manifest: --num-classes"
done

finish
