#!/usr/bin/env bash
# dsplan on the real binary: every verdict, every exit code, the exact figures,
# --json, --table, --dataset and --bench. Machine figures are given (--ram,
# --disk, --gpu-mem) so the results do not depend on the machine running it.
. "$(dirname "$0")/lib.sh"
P=$BIN/dsplan
[ -x "$P" ] || skip "dsplan is not built ($P)"
CIFAR=(--shape 3x32x32)

expect_exit 0 "$P" --help
expect_stdout "--gpu-mem"
expect_stdout "--require"
expect_exit 0 "$P" --version
expect_stdout "dsplan \(dstk\) [0-9]"

# Usage errors: exit 2 with the problem named.
expect_exit 2 "$P" --ram 0 "${CIFAR[@]}"
expect_stderr "invalid --ram '0' \(must be more than 0 bytes\)"
expect_exit 2 "$P" --ram -5G "${CIFAR[@]}"
expect_stderr "cannot be negative"
expect_exit 2 "$P" --disk 12Q "${CIFAR[@]}"
expect_stderr "unknown unit"
expect_exit 2 "$P" --gpu-mem 0 "${CIFAR[@]}"
expect_exit 2 "$P" --ram 1G --shape 3x0x32
expect_exit 2 "$P" --ram 1G --shape 4294967296x4294967296x4294967296 --dtype f64
expect_stderr "overflows 64 bits"
expect_exit 2 "$P" --ram 1G --shape 65536x65536x65536 --samples 10G
expect_stderr "overflows 64 bits"
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --dtype f33
expect_stderr "f33"
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --samples -1
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --samples 0
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --headroom 100%
expect_stderr "invalid --headroom"
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --batch 0
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --order random
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --check
expect_stderr "--check needs a dataset"
expect_exit 2 "$P" --ram 1G --samples 1M
expect_stderr "no data to plan"
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --samples 1M --require everywhere
expect_exit 2 "$P" --ram 1G --dataset "$WORK" --shape 3x32x32
expect_stderr "comes from the manifest"
expect_exit 2 "$P" --no-such-option
# A memory size without a unit below 1 MiB is a forgotten unit, not a budget of bytes.
expect_exit 2 "$P" --ram 128 "${CIFAR[@]}"
expect_stderr "invalid --ram '128' .*did you mean 128G\?"
expect_exit 2 "$P" --gpu-mem 8 "${CIFAR[@]}"
expect_stderr "did you mean 8G\?"
expect_exit 0 "$P" --ram 2097152 --disk 1T "${CIFAR[@]}"
expect_stdout "RAM +2.0 MiB \(given\)"
# No arguments: say what is needed instead of planning a scalar.
expect_exit 2 "$P"
expect_stderr "nothing to plan: dsplan needs the data \(--shape"
# --classes 0 is refused, not silently 10.
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --model small-cnn --classes 0
expect_stderr "invalid --classes 0 \(a classifier needs at least 2 classes\)"
expect_exit 2 "$P" --ram 1G "${CIFAR[@]}" --classes 5
expect_stderr "give it with --model"
expect_exit 0 "$P" --ram 1G --disk 1T "${CIFAR[@]}" --model small-cnn --classes 5
expect_stdout "5 classes"

# The question "how many 3x32x32 f32 samples fit 128 GiB?": the budget and the counts, exactly.
expect_exit 0 "$P" --ram 128G --disk 2T --shape 3x32x32 --dtype f32
expect_stdout "RAM +128.0 GiB \(given\)"
expect_stdout "94.4 GiB = \(128.0 GiB - 10.0 GiB\) x \(1 - 20%\)"
expect_stdout "f32 +12,292 B +8,245,089 "
expect_stdout "u8 +3,076 B +32,951,260 "
expect_stdout "bf16 +6,148 B +16,485,838 "
expect_no_stdout_match() { CHECKS=$((CHECKS + 1)); ! grep -Eq -- "$1" "$OUT" || fail "stdout should not match /$1/"; }
expect_no_stdout_match "verdict"

# The issue's figure: 10M x 3x32x32 f32 = 122,880,000,000 bytes = 114.4 GiB (plus 4 B labels).
expect_exit 0 "$P" --ram 16G --disk 2T --shape 3x32x32 --dtype f32 --samples 10M
expect_stdout "122,920,000,000 bytes; inputs 114.4 GiB"

# Every verdict.
expect_exit 0 "$P" --ram 16G --disk 100G --gpu-mem 8G --shape 3x32x32 --dtype u8 --samples 50K --test 10K --check
expect_stdout "^verdict: device"
expect_exit 0 "$P" --ram 128G --disk 1T --gpu-mem 8G --shape 3x32x32 --dtype f32 --samples 1M --check
expect_stdout "^verdict: ram"
expect_stdout "not device: the data \(11.4 GiB\) exceeds the GPU budget of 6.4 GiB"
expect_exit 0 "$P" --ram 16G --disk 1T --shape 3x32x32 --dtype f32 --samples 10M --check
expect_stdout "^verdict: disk"
expect_stdout "GPU memory unknown"
expect_exit 0 "$P" --ram 16G --disk 10G --shape 3x32x32 --dtype f32 --samples 10M
expect_stdout "^verdict: none"
expect_stdout "fixes, cheapest first"
expect_stdout "fewer samples: at most 698,823 fit on disk"
# The seeds' bf16-versus-f32 analysis, with their arithmetic (no reserve, no headroom).
expect_exit 0 "$P" --ram 504GB --disk 10TB --os-reserve 0 --headroom 0 --label-dtype none --shape 3x32x32 \
    --dtype u8 --samples 73567708 --batch 1 --prefetch 1
expect_stdout "bf16 +6,144 B .* 421.0 GiB +ram"
expect_stdout "f32 +12,288 B .* 841.9 GiB +disk"

# --check and --require: exit 3 when it does not fit, with the cheapest fix on stderr.
expect_exit 3 "$P" --ram 16G --disk 50G --shape 3x32x32 --dtype f32 --samples 10M --check
expect_stderr "check failed: placement none .*cheapest fix: store the input as u8"
expect_exit 3 "$P" --ram 16G --disk 1T --shape 3x32x32 --dtype f32 --samples 10M --require ram
expect_stderr "placement disk is worse than the required ram"
expect_exit 0 "$P" --ram 16G --disk 1T --shape 3x32x32 --dtype f32 --samples 10M --require disk
expect_exit 3 "$P" --ram 16G --disk 1T --gpu-mem 2G --shape 3x32x32 --dtype f32 --samples 1K --batch 65536 --check
expect_stderr "cheapest fix: a smaller batch"
expect_exit 3 "$P" -q --ram 16G --disk 10G --shape 3x32x32 --samples 10M --check
expect_no_stdout

# Without a GPU and without --gpu-mem, it says so and still plans.
expect_exit 0 "$P" --ram 16G --disk 1T --shape 3x32x32 --samples 1M
if ! "$P" --ram 1G --shape 1 2>/dev/null | grep -q "GPU .*detected"; then
    expect_stdout "note: no GPU \(.*\): GPU placement not checked; give --gpu-mem 8G"
fi
expect_stdout "no --model: the GPU figures cover the data only"

# --model adds dstrain's training footprint to the GPU figures: a small GPU
# that holds the data alone no longer holds data and model.
expect_exit 0 "$P" --ram 16G --disk 1T --gpu-mem 700M --shape 3x32x32 --dtype u8 --samples 1K
expect_stdout "^verdict: device"
expect_exit 0 "$P" --ram 16G --disk 1T --gpu-mem 700M --shape 3x32x32 --dtype u8 --samples 1K --model ref-cnn
expect_stdout "training footprint [0-9.]+ MiB"
expect_stdout "ref-cnn: 666,858 parameters, 10 classes, 176.6 MFLOP per trained sample in its matrix products"
expect_stdout "^verdict: none"
expect_stdout "a smaller model"
expect_exit 0 "$P" --json --ram 16G --disk 1T --gpu-mem 8G --shape 3x32x32 --dtype u8 --samples 1K --model ref-cnn
expect_true "model footprint in --json" jq -e '.job.model_footprint_included == true and
    .job.model_footprint_bytes > 400*1048576 and .job.model_footprint_bytes < 1024*1048576' "$OUT"
expect_true "model FLOPs in --json" jq -e '.job.model_training_flops_per_sample == 176569344' "$OUT"
# The footprint is computed from the plan, not by building a trainer: the
# figures of the presets at --batch 256 are those the built trainer gave
# (dsplan of 2fcaf4d), and --batch 4096 on resnet9 (a 23 GB trainer, killed
# for memory before) sizes in little memory: under 1 GB (a build with CUDA
# maps its libraries at start, a few hundred MB of RSS whatever the model).
for want in 3x32x32:ref-cnn:962754808 3x32x32:small-cnn:660932280 3x32x32:resnet9:2191797624 \
    3x32x32:mlp:599886968 1x28x28:ref-cnn:858119672 1x28x28:small-cnn:628660280 1x28x28:resnet9:1804105592 \
    1x28x28:mlp:560548984; do
    IFS=: read -r shape model bytes <<<"$want"
    expect_exit 0 "$P" --json --ram 16G --disk 1T --shape "$shape" --model "$model" --samples 100 --batch 256
    expect_true "$model on $shape: footprint $bytes bytes" jq -e ".job.model_footprint_bytes == $bytes" "$OUT"
done
run_measuring_rss "$P" --ram 16G --disk 1T --shape 3x32x32 --model resnet9 --samples 100 --batch 4096
expect_true "dsplan --model resnet9 --batch 4096 exits 0 (got $RSS_RC)" test "$RSS_RC" -eq 0
expect_true "dsplan --batch 4096 peak RSS $RSS_BYTES under 1 GB" test "$RSS_BYTES" -lt 1000000000
# --compute-rate with --model: the matrix products' rate (176,569,344 FLOP x 400,000 samples/s).
expect_exit 0 "$P" --ram 16G --disk 1T --gpu-mem 8G --shape 3x32x32 --dtype u8 --samples 50K --model ref-cnn \
    --compute-rate 400K
expect_stdout "compute     0.12 s \(70.6 TFLOP/s in the matrix products\)"

# --json: one document on stdout with the same figures.
expect_exit 0 "$P" --json --ram 128G --disk 1T --gpu-mem 8G --shape 3x32x32 --dtype f32 --samples 10M
if [ -n "${PY:=$(command -v python3 || true)}" ]; then
    expect_true "--json document" "$PY" - "$OUT" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["tool"] == "dsplan"
assert d["machine"]["ram"] == {"bytes": 128 << 30, "source": "given"}, d["machine"]["ram"]
assert d["budgets"]["ram_bytes"] == 101361228185, d["budgets"]
assert d["data"]["input_bytes"] == 122880000000
assert d["data"]["dataset_bytes"] == 122920000000
assert d["verdict"]["placement"] == "disk" and d["verdict"]["fits"] is True
assert d["capacity"][0]["dtype"] == "f32" and d["capacity"][0]["ram_samples"] == 8245089
assert d["job"]["model_footprint_included"] is False
assert d["check"] is None and d["table"] is None
PYEOF
fi

# --table: RAM sizes 16G to 1T as rows.
expect_exit 0 "$P" --table --shape 3x32x32 --dtype f32
expect_stdout "^ +16.0 GiB +4.8 GiB +418,269 "
expect_stdout "^ +128.0 GiB +94.4 GiB +8,245,089 "
expect_stdout "^ +1.0 TiB +811.2 GiB +70,859,646 "
expect_exit 0 "$P" --table
expect_stdout "no --shape given: sizing 3x32x32"

# An existing dataset: from its manifest; a broken manifest exits 1.
mkdir -p "$WORK/broken" && echo '{"format_version": 1, "splits": [' >"$WORK/broken/dataset.json"
expect_exit 1 "$P" --dataset "$WORK/broken"
expect_stderr "dataset.json"
expect_exit 1 "$P" --dataset "$WORK/nothing-here"
if [ -x "$BIN/dsgen" ]; then
    expect_exit 0 "$BIN/dsgen" "$WORK/ds" --train 2000 --test 500 --shape 3x8x8 --dtype u8 --seed 1
    expect_exit 0 "$P" --dataset "$WORK/ds" --ram 16G --gpu-mem 8G --check
    expect_stdout "samples +2,000 train \+ 500 test"
    expect_stdout "already there"
    expect_stdout "^verdict: device"
    expect_exit 0 "$P" --dataset "$WORK/ds" --ram 16G --disk 1K --check # already on disk
    expect_stdout "^verdict: ram"
    expect_exit 0 "$P" --dataset "$WORK/ds" --dtype f32 --ram 16G --disk 1T
    expect_stdout "sample +x f32\[3x8x8\] 768 B \+ y i32 4 B = 772 B"
    expect_stdout "on disk .*npy files as dsgen and dsconvert write them"
    # A zstd-chunked dataset: its disk bytes are its (compressed) files.
    if [ -x "$BIN/dsconvert" ] && [ -n "${PY:=$(command -v python3 || true)}" ]; then
        expect_exit 0 "$BIN/dsconvert" "$WORK/ds" "$WORK/dsz" --compress zstd -q
        expect_exit 0 "$P" --dataset "$WORK/dsz" --ram 16G --json
        ZBYTES=$(cat "$WORK"/dsz/*.zst | wc -c)
        expect_true "disk bytes of the zstd dataset = its files ($ZBYTES)" "$PY" -c \
            "import json,sys; d=json.load(open(sys.argv[1])); assert d['data']['disk_bytes'] == int(sys.argv[2]), d['data']; assert d['data']['dataset_bytes'] == 2500 * 196" \
            "$OUT" "$ZBYTES"
    fi
fi

# ---- samples of several fields (issue 24): --field, and datasets of them ----
# The neuroscience recording: every field counts, 1,792 B a sample, not "label 4 B".
NEURO=(--field stim:1x36x36:u8 --field robs:120:f32 --field behavior:4:f32)
expect_exit 0 "$P" --ram 64G --disk 1T "${NEURO[@]}" --samples 1M --test 100K
expect_stdout "sample +stim u8\[1x36x36\] 1,296 B \+ robs f32\[120\] 480 B \+ behavior f32\[4\] 16 B = 1,792 B"
expect_stdout "roles +input stim, label none"
expect_stdout "in memory .*\(1,971,200,000 bytes; inputs"
# The capacity rows vary the input field (the first --field): stim as bf16 is 2,592 + 496 B.
expect_stdout "bf16 +3,088 B "
expect_exit 0 "$P" --json --ram 64G --disk 1T "${NEURO[@]}" --field moves::i32 --samples 1000
expect_true "--field in --json" "${PY:-python3}" -c '
import json, sys
d = json.load(open(sys.argv[1]))["data"]
assert [f["name"] for f in d["fields"]] == ["stim", "robs", "behavior", "moves"], d["fields"]
assert d["fields"][3] == {"name": "moves", "shape": "scalar", "dtype": "i32", "bytes_per_sample": 4}, d["fields"][3]
assert d["bytes_per_sample"] == 1796 and d["dataset_bytes"] == 1796000 and d["input_field"] == "stim"
' "$OUT"
# --shape describes x and y; --field adds more.
expect_exit 0 "$P" --ram 16G --shape 3x32x32 --dtype u8 --field aux:4:f32 --samples 10
expect_stdout "sample +x u8\[3x32x32\] 3,072 B \+ y i32 4 B \+ aux f32\[4\] 16 B = 3,092 B"
expect_exit 2 "$P" --ram 16G --field robs:120 --samples 10
expect_stderr "invalid --field 'robs:120' \(expected three parts separated by ':'\); give NAME:SHAPE:DTYPE"
expect_exit 2 "$P" --ram 16G --field robs:120:f99 --samples 10
expect_stderr "f99"
expect_exit 2 "$P" --ram 16G --shape 3x8x8 --field y::i64 --samples 10
expect_stderr "a field named 'y' is given already \(--shape describes x and y\)"
expect_exit 2 "$P" --ram 16G "${NEURO[@]}" --label-dtype i64 --samples 10
expect_stderr "--label-dtype describes the label of --shape; give a label as --field NAME::DTYPE"
# No RAM left after the OS reserve: said, with the option to change.
expect_exit 0 "$P" --ram 8G --disk 1T "${NEURO[@]}" --samples 1M
expect_stdout "RAM +0 B = \(8.0 GiB - 10.0 GiB\)"
expect_stdout "note: the OS reserve of 10.0 GiB \(--os-reserve\) leaves no RAM of the 8.0 GiB .*give a smaller --os-reserve"
expect_stdout "not ram: the OS reserve of 10.0 GiB \(--os-reserve\) leaves no RAM budget"
expect_exit 0 "$P" --ram 8G --disk 1T "${NEURO[@]}" --samples 1M --os-reserve 2G
expect_stdout "^verdict: ram"
expect_exit 0 "$P" --json --ram 8G --disk 1T "${NEURO[@]}" --samples 1M
expect_true "the note in --json" jq -e '.budgets.ram_bytes == 0 and (.budgets.notes[0] | test("--os-reserve"))' "$OUT"

# Existing datasets of several fields, one or several: every field of every
# split counts, and the disk bytes are the files' sizes, exactly.
NPY=$(numpy_python)
if [ -x "$BIN/dsconvert" ] && [ -n "$NPY" ]; then
    (cd "$WORK" && "$NPY" -c '
import numpy as np
r = np.random.default_rng(2)
for name, n in (("r1", 300), ("r2", 120)):
    np.savez(name + ".npz", stim_train=r.integers(0, 256, (n, 1, 36, 36)).astype(np.uint8),
             robs_train=r.random((n, 120), dtype=np.float32), behavior_train=r.random((n, 4), dtype=np.float32),
             stim_test=r.integers(0, 256, (20, 1, 36, 36)).astype(np.uint8),
             robs_test=r.random((20, 120), dtype=np.float32), behavior_test=r.random((20, 4), dtype=np.float32))
np.savez("other.npz", x=np.zeros((10, 3), np.float32))')
    for m in r1 r2; do expect_exit 0 "$BIN/dsconvert" "$WORK/$m.npz" "$WORK/$m" --input stim -q; done
    expect_exit 0 "$BIN/dsconvert" "$WORK/other.npz" "$WORK/other" -q
    expect_exit 0 "$BIN/dsconvert" "$WORK/r2.npz" "$WORK/r2z" --input stim --compress zstd -q
    files_bytes() { local t=0 f; for d in "$@"; do for f in "$d"/*.npy "$d"/*.zst; do [ -e "$f" ] && t=$((t + $(stat -c %s "$f"))); done; done; echo $t; }
    expect_exit 0 "$P" --dataset "$WORK/r1" --ram 16G --disk 1T
    expect_stdout "dataset +$WORK/r1: 300 train \+ 20 test"
    expect_stdout "sample +stim u8\[1x36x36\] 1,296 B \+ robs f32\[120\] 480 B \+ behavior f32\[4\] 16 B = 1,792 B"
    expect_stdout "in memory .*\(573,440 bytes; inputs"
    expect_exit 0 "$P" --dataset "$WORK/r1" --dataset "$WORK/r2z" --ram 16G --disk 1T --json
    expect_true "two datasets: the totals are the files' sizes ($(files_bytes "$WORK/r1" "$WORK/r2z"))" "${PY:-python3}" -c '
import json, sys
d = json.load(open(sys.argv[1]))["data"]
assert d["disk_bytes"] == int(sys.argv[2]), (d["disk_bytes"], sys.argv[2])
assert [x["disk_bytes"] for x in d["datasets"]] == [int(sys.argv[3]), int(sys.argv[4])], d["datasets"]
assert d["train"] == 420 and d["test"] == 40 and d["dataset_bytes"] == 460 * 1792
assert [x["train"] for x in d["datasets"]] == [300, 120]
' "$OUT" "$(files_bytes "$WORK/r1" "$WORK/r2z")" "$(files_bytes "$WORK/r1")" "$(files_bytes "$WORK/r2z")"
    expect_exit 0 "$P" --dataset "$WORK/r1" --dataset "$WORK/r2" --ram 16G --disk 1T
    expect_stdout "dataset +$WORK/r2: 120 train \+ 20 test"
    expect_stdout "samples +420 train \+ 40 test = 460 \(2 datasets\)"
    expect_stdout "on disk +$(( $(files_bytes "$WORK/r1" "$WORK/r2") / 1024 ))\.[0-9] KiB \(already there\)"
    # A mix (issue 25): each member's training split as u8, bf16 and f32, which are kept in RAM,
    # the plan dstrain builds (one line per member) and the epoch.
    expect_exit 0 "$P" --dataset "$WORK/r1" --dataset "$WORK/r2" --ram 16G --disk 1T --weights 1,3 --batch 32
    expect_stdout "^mix \(2 datasets; training splits"
    expect_stdout "^  $WORK/r1 +300 +25\.0% +525\.0 KiB +yes +904\.7 KiB +yes"
    expect_stdout "^  $WORK/r2 +120 +75\.0%"
    expect_stdout "^  total .* 2/2"
    expect_stdout "^  mix: 0 $WORK/r1 \(300 samples, 25\.0% of draws\)"
    expect_stdout "^  mix: 1 $WORK/r2 \(120 samples, 75\.0% of draws\)"
    expect_stdout "^mix epoch \(160 draws\)"
    # Under a RAM budget that keeps one member as f32: the one drawn most per byte (r2: 3x the
    # weight on 0.4x the samples), and the plan streams the other.
    expect_exit 0 "$P" --dataset "$WORK/r1" --dataset "$WORK/r2" --ram 1560K --os-reserve 0 --headroom 0 \
        --disk 1T --weights 1,3 --batch 32 --json
    expect_true "a budget of 1,560 KiB keeps r2 as f32 and not r1" "${PY:-python3}" -c '
import json, sys
m = json.load(open(sys.argv[1]))["mix"]
r1, r2 = m["members"]
assert r1["bytes"]["f32"] == 300 * (1296 * 4 + 496) and r2["bytes"]["f32"] == 120 * (1296 * 4 + 496), m["members"]
assert (r1["in_ram"]["f32"], r2["in_ram"]["f32"]) == (False, True), m["members"]
assert (r1["in_ram"]["u8"], r2["in_ram"]["u8"]) == (True, True), m["members"]
assert [x["quota"] for x in m["plan"]["members"]] == [40, 120], m["plan"]["members"]
assert m["ram_budget"] == 1560 * 1024
' "$OUT"
    expect_exit 2 "$P" --dataset "$WORK/r1" --dataset "$WORK/r2" --ram 16G --weights 1,2,3
    expect_stderr "--weights gives 3 weights for 2 --dataset; give one per dataset"
    expect_exit 0 "$P" --dataset "$WORK/r1" --dataset "$WORK/r2" --ram 16G --weights 1,3
    expect_stdout "mix data path: not planned: --batch 256 is larger than the mix's epoch \(160 samples\)"
    expect_exit 2 "$P" --dataset "$WORK/r1" --ram 16G --weights 2
    expect_stderr "--weights needs several --dataset"
    # Weights are positive finite numbers, as dstrain checks them (one validator).
    for w in 1,nan 1,inf 1,0 1,-2 1,x; do
        expect_exit 2 "$P" --dataset "$WORK/r1" --dataset "$WORK/r2" --ram 16G --weights "$w"
        expect_stderr "--weights: '${w#1,}' is not a weight \(weights must be positive finite numbers"
        expect_true "--weights $w: no 300-digit range" bash -c "! grep -q 179769 '$ERR'"
    done
    expect_exit 2 "$P" --dataset "$WORK/r1" --dataset "$WORK/other" --ram 16G
    expect_stderr "'$WORK/other' has fields x f32\[3\] but '$WORK/r1' has stim u8\[1x36x36\], robs f32\[120\], behavior f32\[4\]"
    expect_exit 2 "$P" --dataset "$WORK/r1" --field a:1:u8 --ram 16G
    expect_stderr "cannot be used with --dataset"
    expect_exit 0 "$BIN/dsconvert" "$WORK/r1.npz" "$WORK/r1-noroles" -q
    expect_exit 2 "$P" --dataset "$WORK/r1-noroles" --dtype bf16 --ram 16G
    expect_stderr "names no input field; set it with dsconvert --input NAME"
    expect_exit 0 "$P" --dataset "$WORK/r1-noroles" --ram 16G --disk 1T
    expect_stdout "as stored +1,792 B"
fi

# --bench: predicted epoch time from dsbench's measured rates.
cat >"$WORK/bench.json" <<'EOF'
{"schema_version": 1, "context": {"dstk_version": "0.1.0"},
 "results": [
  {"case": "io.seq.pread.cold", "status": "ok", "metrics": {"rate": {"unit": "B/s", "median": 1e9}}},
  {"case": "h2d.pinned", "status": "ok", "params": {"transfer_bytes": 67108864},
   "metrics": {"rate": {"unit": "B/s", "median": 5e10}}}]}
EOF
expect_exit 0 "$P" --ram 16G --disk 1T --shape 3x32x32 --dtype u8 --samples 10M --bench "$WORK/bench.json" \
    --compute-rate 500K
expect_stdout "^verdict: disk"
expect_stdout "disk read +30.76 s \(28.6 GiB at the sequential read rate"
expect_stdout "compute +20.00 s"
expect_stdout "epoch +30.76 s at least, limited by read \(disk\): I/O-bound"
expect_stdout "recommended --prefetch 3"
expect_stdout "recommended chunk size 1,536 samples"
expect_exit 0 "$P" --ram 128G --disk 1T --shape 3x32x32 --dtype u8 --samples 10M --bench "$WORK/bench.json" \
    --compute-rate 100K
expect_stdout "limited by compute$"
# --data stream: the epoch from disk (cold page cache) even where the data
# fits in RAM, the chunk reads timed at the thread count the window cache
# runs (16 in the chunk order, 4 in the sequential), not the sweep's best.
cat >"$WORK/bench-threads.json" <<'EOF'
{"schema_version": 1, "context": {"dstk_version": "0.1.0"},
 "results": [
  {"case": "io.seq.pread.cold", "status": "ok", "metrics": {"rate": {"unit": "B/s", "median": 1e9}}},
  {"case": "io.rand.chunk.pread.cold", "variant": "threads=1", "status": "ok", "params": {"threads": 1},
   "metrics": {"rate": {"unit": "B/s", "median": 0.5e9}}},
  {"case": "io.rand.chunk.pread.cold", "variant": "threads=4", "status": "ok", "params": {"threads": 4},
   "metrics": {"rate": {"unit": "B/s", "median": 2e9}}},
  {"case": "io.rand.chunk.pread.cold", "variant": "threads=16", "status": "ok", "params": {"threads": 16},
   "metrics": {"rate": {"unit": "B/s", "median": 1.5e9}}}]}
EOF
expect_exit 0 "$P" --ram 128G --disk 1T --shape 3x32x32 --dtype u8 --samples 10M --bench "$WORK/bench-threads.json" \
    --compute-rate 100K --data stream
expect_stdout "streamed from disk, cold page cache"
expect_stdout "disk read +20.51 s \(28.6 GiB at the random chunk read rate at 16 threads"
expect_stdout "limited by compute$"
expect_exit 0 "$P" --ram 128G --disk 1T --shape 3x32x32 --dtype u8 --samples 10M --bench "$WORK/bench-threads.json" \
    --compute-rate 1M --data stream --order sequential
expect_stdout "disk read +15.38 s \(28.6 GiB at the random chunk read rate at 4 threads"
expect_stdout "limited by read \(disk\): I/O-bound"
expect_exit 0 "$P" --ram 128G --disk 1T --shape 3x32x32 --dtype u8 --samples 10M --bench "$WORK/bench-threads.json" \
    --compute-rate 1M --data stream --order sequential --json
expect_true "JSON names the limiting stage and the thread count" "$PY" -c \
    "import json,sys; e=json.load(open(sys.argv[1]))['epoch']; assert e['limited_by'] == 'read (disk)' and e['chunk_read_threads'] == 4 and e['data'] == 'disk', e" \
    "$OUT"
expect_exit 2 "$P" --ram 16G --shape 3x32x32 --samples 1M --data managed
expect_stderr "--data managed is not estimated"
echo 'not json' >"$WORK/bad-bench.json"
expect_exit 1 "$P" --ram 16G --shape 3x32x32 --samples 1M --bench "$WORK/bad-bench.json"
expect_stderr "not a dsbench results file"

finish
