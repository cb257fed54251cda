#!/usr/bin/env bash
# Nothing lost (issue 27, cases 1-7): every output is put in place by one
# rename that decides then whether the name may be replaced; side files
# (--report-json, --log-json) go in before the main output and are withdrawn
# with it; --resume trusts only what dsconvert staged; a closed stderr never
# becomes an output. Concurrent runs are interleaved at the rename with the
# test hook DSTK_TEST_HOLD_FIFO (atomic_output.cpp), never with sleeps; each
# case runs again with DSTK_TEST_NO_RENAMEAT2=1, the fallbacks of filesystems
# without renameat2's flags.
source "$(dirname "$0")/lib.sh"
D="$BIN/dsconvert"
DSGEN="$BIN/dsgen"
DSTRAIN="$BIN/dstrain"
for t in "$D" "$DSGEN" "$DSTRAIN"; do [ -x "$t" ] || skip "no $(basename "$t") binary in $BIN"; done
cd "$WORK"

# no_leftovers DIR: no temporary outputs (".NAME.tmp-*") left in DIR.
no_leftovers() {
    CHECKS=$((CHECKS + 1))
    local left
    left=$(find "$1" -maxdepth 1 -name '.*.tmp-*' | head -3)
    [ -z "$left" ] || fail "temporary outputs left behind: $left"
}

# ---- holding a run at its rename -------------------------------------------
# start_held NAME TAG STDIN cmd...: runs cmd in the background with STDIN,
# stdout/stderr in TAG.out/TAG.err; returns once it is about to put its
# output NAME in place (it wrote "placing PATH" into the FIFO and waits).
HOLD="$WORK/hold.fifo"
mkfifo "$HOLD"
start_held() {
    local name=$1 tag=$2 in=$3
    shift 3
    DSTK_TEST_HOLD_FIFO="$HOLD" DSTK_TEST_HOLD_AT="$name" "$@" >"$tag.out" 2>"$tag.err" <"$in" &
    HELD_PID=$!
    CHECKS=$((CHECKS + 1))
    timeout 60 cat "$HOLD" >"$WORK/.placing" || fail "the held run never reached the rename of $name: $*"
    grep -q "placing .*$name" "$WORK/.placing" || fail "the held run reported '$(cat "$WORK/.placing")'"
}
# release TAG: lets the held run go on; its exit code in HELD_RC, its output in $OUT/$ERR.
release() {
    timeout 60 sh -c ': >"$1"' _ "$HOLD" || fail "the held run did not wait at its rename"
    wait "$HELD_PID"
    HELD_RC=$?
    cp "$1.out" "$OUT"
    cp "$1.err" "$ERR"
}
# expect_exit_from FILE CODE cmd...: expect_exit with stdin from FILE.
expect_exit_from() {
    local in=$1 want=$2
    shift 2
    CHECKS=$((CHECKS + 1))
    "$@" >"$OUT" 2>"$ERR" <"$in"
    local got=$?
    [ "$got" -eq "$want" ] || fail "exit $got, expected $want: $* < $in"
    return 0
}
# jq_true FILE FILTER: jq -e, quietly.
jq_true() { jq -e "$2" "$1" >/dev/null 2>&1; }
expect_held_exit() {
    CHECKS=$((CHECKS + 1))
    [ "$HELD_RC" -eq "$1" ] || fail "held run: exit $HELD_RC, expected $1"
}

head -c $((100 * 16)) /dev/urandom >x.raw
head -c $((100 * 16)) /dev/urandom >y.raw
RAW=(--from raw --shape 16 --in-dtype u8 -q)
"$DSGEN" ds --train 128 --test 32 --shape 1x4x4 --classes 2 --seed 3 -q >/dev/null || { echo "dsgen failed" >&2; exit 1; }
TRAIN=("$WORK/ds" --model flatten,fc:2 --device cpu -T 1 --epochs 1 --batch 32)

for fallback in 0 1; do
    export DSTK_TEST_NO_RENAMEAT2=$fallback
    W="$WORK/f$fallback"
    mkdir -p "$W"

    # ---- 1. two dstrain runs in one folder: the second model gets a free name at its rename
    mkdir -p "$W/c1"
    start_held model.safetensors "$W/b1" /dev/null env -C "$W/c1" "$DSTRAIN" "${TRAIN[@]}"
    (cd "$W/c1" && "$DSTRAIN" "${TRAIN[@]}" -q) || fail "the first run failed"
    cp "$W/c1/model.safetensors" "$W/first.safetensors"
    release "$W/b1"
    expect_held_exit 0
    expect_stderr "model.safetensors exists: this run's model goes to model-2.safetensors"
    expect_stderr "model saved to model-2.safetensors"
    expect_same "$W/c1/model.safetensors" "$W/first.safetensors"
    expect_file "$W/c1/model-2.safetensors"
    no_leftovers "$W/c1"
    # --save FILE taken during the run: nothing replaced, the model beside it, exit 1 naming both.
    start_held m.safetensors "$W/b1s" /dev/null "$DSTRAIN" "${TRAIN[@]}" --save "$W/c1/m.safetensors"
    echo mine >"$W/c1/m.safetensors"
    release "$W/b1s"
    expect_held_exit 1
    expect_stderr "m.safetensors' was created by another process during the run, so this run's model is '.*m-2.safetensors'"
    expect_true "--save: the other process's file is kept" grep -qx mine "$W/c1/m.safetensors"
    expect_exit 0 "$DSTRAIN" eval "$WORK/ds" --weights "$W/c1/m-2.safetensors" --device cpu -q
    # --force replaces a regular file, never a link that appeared meanwhile (the model then withdrawn).
    start_held m.safetensors "$W/b1f" /dev/null "$DSTRAIN" "${TRAIN[@]}" --save "$W/c1/m.safetensors" --force
    rm "$W/c1/m.safetensors" && ln -s "$W/first.safetensors" "$W/c1/m.safetensors"
    release "$W/b1f"
    expect_held_exit 2
    expect_stderr "m.safetensors' exists and is a symbolic link"
    expect_true "--force: the link is kept" test -L "$W/c1/m.safetensors"
    expect_same "$W/first.safetensors" "$W/c1/model.safetensors"
    no_leftovers "$W/c1"

    # ---- 2. dsconvert - out --force: a folder that appears meanwhile is not a dataset
    mkfifo "$W/in.fifo"
    "$D" - "$W/out2" --force "${RAW[@]}" <"$W/in.fifo" 2>"$ERR" &
    pid=$!
    exec 3>"$W/in.fifo"
    head -c 800 x.raw >&3
    mkdir "$W/out2" && echo mine >"$W/out2/notes.txt"
    tail -c +801 x.raw >&3
    exec 3>&-
    wait $pid
    rc=$?
    CHECKS=$((CHECKS + 1))
    [ "$rc" -eq 2 ] || fail "dsconvert - out --force over a folder made meanwhile: exit $rc, expected 2"
    expect_stderr "out2' is a directory but not a dataset"
    expect_true "notes.txt kept" grep -qx mine "$W/out2/notes.txt"
    no_leftovers "$W"
    # The same, decided at the rename: held there while the folder is made.
    rm -r "$W/out2"
    start_held out2 "$W/b2" x.raw "$D" - "$W/out2" --force "${RAW[@]}"
    mkdir "$W/out2" && echo mine >"$W/out2/notes.txt"
    release "$W/b2"
    expect_held_exit 2
    expect_stderr "out2' is a directory but not a dataset"
    expect_true "notes.txt kept (held)" grep -qx mine "$W/out2/notes.txt"
    no_leftovers "$W"
    # An earlier dataset with a file of the user's added meanwhile is not replaced either.
    rm -r "$W/out2"
    expect_exit 0 "$D" x.raw "$W/out2" "${RAW[@]}"
    start_held out2 "$W/b2d" y.raw "$D" - "$W/out2" --force "${RAW[@]}"
    echo mine >"$W/out2/notes.txt"
    release "$W/b2d"
    expect_held_exit 2
    expect_stderr "out2' is a dataset that also holds 'notes.txt'"
    expect_true "notes.txt kept in the dataset" grep -qx mine "$W/out2/notes.txt"
    expect_exit 0 "$D" --verify "$W/out2"
    rm "$W/out2/notes.txt"
    # Untouched, an earlier dataset is replaced by --force.
    expect_exit_from y.raw 0 "$D" - "$W/out2" --force "${RAW[@]}"
    expect_exit 0 "$D" y.raw "$W/ref2" "${RAW[@]}"
    expect_same "$W/out2/train_x.npy" "$W/ref2/train_x.npy"
    no_leftovers "$W"

    # ---- 3. two dsconvert - out.npy at once: the second to finish is refused
    start_held out3.npy "$W/b3" x.raw "$D" - "$W/out3.npy" "${RAW[@]}"
    expect_exit_from y.raw 0 "$D" - "$W/out3.npy" "${RAW[@]}"
    cp "$W/out3.npy" "$W/other3.npy"
    release "$W/b3"
    expect_held_exit 2
    expect_stderr "out3.npy' already exists \(another process wrote it while this one ran; nothing was replaced\)"
    expect_same "$W/out3.npy" "$W/other3.npy"
    no_leftovers "$W"
    # With --force the later one replaces the regular file; a link is never replaced.
    start_held out3.npy "$W/b3f" x.raw "$D" - "$W/out3.npy" "${RAW[@]}" --force
    release "$W/b3f"
    expect_held_exit 0
    expect_exit 0 "$D" x.raw "$W/ref3.npy" "${RAW[@]}"
    expect_same "$W/out3.npy" "$W/ref3.npy"
    echo keep >"$W/victim"
    start_held out3.npy "$W/b3l" x.raw "$D" - "$W/out3.npy" "${RAW[@]}" --force
    rm "$W/out3.npy" && ln -s "$W/victim" "$W/out3.npy"
    release "$W/b3l"
    expect_held_exit 2
    expect_stderr "out3.npy' exists and is a symbolic link"
    expect_true "the link is kept" test -L "$W/out3.npy"
    expect_true "its target is untouched" grep -qx keep "$W/victim"
    no_leftovers "$W"
    # Directory outputs: two dsgen to one name.
    start_held g3 "$W/b3g" /dev/null "$DSGEN" "$W/g3" --train 64 --shape 1x2x2 --seed 1 -q
    expect_exit 0 "$DSGEN" "$W/g3" --train 64 --shape 1x2x2 --seed 2 -q
    cp "$W/g3/train_x.npy" "$W/g3.other"
    release "$W/b3g"
    expect_held_exit 2
    expect_stderr "g3' already exists"
    expect_same "$W/g3/train_x.npy" "$W/g3.other"
    no_leftovers "$W"

    # ---- 4. --log-json: never emptied, never written through a link
    mkdir -p "$W/c4"
    echo mine >"$W/c4/run.jsonl"
    expect_exit 2 "$DSTRAIN" "${TRAIN[@]}" --log-json "$W/c4/run.jsonl"
    expect_stderr "run.jsonl' already exists"
    expect_true "--log-json: the existing file is untouched" grep -qx mine "$W/c4/run.jsonl"
    expect_no_file "$W/c4/model.safetensors"
    expect_exit 0 "$DSTRAIN" "${TRAIN[@]}" --log-json "$W/c4/run.jsonl" --force
    expect_true "--force: replaced by the run's lines" jq_true "$W/c4/run.jsonl" 'select(.event == "epoch") | .epoch == 1'
    echo keep >"$W/c4/target"
    ln -s "$W/c4/target" "$W/c4/link.jsonl"
    for f in "" --force; do
        expect_exit 2 "$DSTRAIN" "${TRAIN[@]}" --log-json "$W/c4/link.jsonl" $f
        expect_stderr "link.jsonl' exists and is a symbolic link"
        expect_true "the link's target is untouched ($f)" grep -qx keep "$W/c4/target"
    done
    # The log is put in place at the start (read while the run goes): a name
    # taken just before is refused then, before any training.
    start_held run2.jsonl "$W/b4" /dev/null "$DSTRAIN" "${TRAIN[@]}" --log-json "$W/c4/run2.jsonl" --save "$W/c4/r2.safetensors"
    echo mine >"$W/c4/run2.jsonl"
    release "$W/b4"
    expect_held_exit 2
    expect_stderr "run2.jsonl' already exists \(another process wrote it"
    expect_true "the other process's log is kept" grep -qx mine "$W/c4/run2.jsonl"
    expect_no_file "$W/c4/r2.safetensors"
    # Two runs to one log: the second is refused at its start, the first's log intact.
    start_held model.safetensors "$W/b4b" /dev/null "$DSTRAIN" "${TRAIN[@]}" --log-json "$W/c4/run3.jsonl" --checkpoint "$W/c4/ck3"
    expect_exit 2 "$DSTRAIN" "${TRAIN[@]}" --log-json "$W/c4/run3.jsonl"
    expect_stderr "run3.jsonl' already exists"
    release "$W/b4b"
    expect_held_exit 0
    expect_true "the first run's log is whole" jq_true "$W/c4/run3.jsonl" 'select(.event == "epoch") | .epoch == 1'
    # A run that fails keeps its log (the record of what it did); a resumed run continues it.
    expect_exit 1 "$DSTRAIN" "${TRAIN[@]}" --lr 1e30 --log-json "$W/c4/div.jsonl"
    expect_stderr "non-finite loss"
    expect_true "a failed run's log is kept" jq_true "$W/c4/div.jsonl" 'select(.event == "memory")'
    expect_exit 0 "$DSTRAIN" "${TRAIN[@]}" --checkpoint "$W/c4/ck" --log-json "$W/c4/res.jsonl"
    expect_exit 0 "$DSTRAIN" --checkpoint "$W/c4/ck" --resume --epochs 2 --log-json "$W/c4/res.jsonl" -q
    expect_true "--resume continues the log: epochs 1 and 2" \
        test "$(jq -r 'select(.event == "epoch") | .epoch' "$W/c4/res.jsonl" | tr '\n' ' ')" = "1 2 "
    no_leftovers "$W/c4"

    # ---- 5. --resume trusts only regular files dsconvert staged
    expect_exit 0 "$D" x.raw "$W/ref5" "${RAW[@]}"
    echo keep >"$W/victim5"
    for plant in link unknown subdir dirlink statelink; do
        rm -rf "$W/.out5.partial" "$W/out5"
        mkdir "$W/.out5.partial"
        case $plant in
        link) ln -s "$W/victim5" "$W/.out5.partial/train_x.npy"; why="train_x.npy' is a symbolic link" ;;
        unknown) echo x >"$W/.out5.partial/evil"; why="evil' is not a file dsconvert writes there" ;;
        subdir) mkdir "$W/.out5.partial/train_x.npy"; why="train_x.npy' is not a regular file" ;;
        statelink) ln -s "$W/victim5" "$W/.out5.partial/resume.json"; why="resume.json' is a symbolic link" ;;
        dirlink) rmdir "$W/.out5.partial" && mkdir "$W/elsewhere" && ln -s "$W/elsewhere" "$W/.out5.partial"
            why="out5.partial' is not a directory of this user" ;;
        esac
        expect_exit 2 "$D" x.raw "$W/out5" "${RAW[@]}" --resume
        expect_stderr "$why; --resume continues only what dsconvert staged there"
        expect_true "--resume ($plant): the file outside is untouched" grep -qx keep "$W/victim5"
        expect_no_file "$W/out5"
    done
    rm -rf "$W/.out5.partial" "$W/elsewhere"
    # OUTPUT taken at the rename: the partial directory stays resumable.
    start_held out5 "$W/b5" /dev/null "$D" x.raw "$W/out5" --from raw --shape 16 --in-dtype u8 --resume
    mkdir "$W/out5" && echo mine >"$W/out5/notes.txt"
    release "$W/b5"
    expect_held_exit 2
    expect_true "the partial directory is kept, resumable" test -f "$W/.out5.partial/resume.json"
    rm -r "$W/out5"
    expect_exit 0 "$D" x.raw "$W/out5" --from raw --shape 16 --in-dtype u8 --resume
    expect_stderr "resuming the partial conversion"
    expect_same "$W/out5/train_x.npy" "$W/ref5/train_x.npy"
    expect_no_file "$W/.out5.partial"

    # ---- 6. --report-json: no-replace, a side file put in place before OUTPUT and withdrawn with it
    echo old >"$W/r6.json"
    expect_exit 2 "$D" x.raw "$W/out6" "${RAW[@]}" --report-json "$W/r6.json"
    expect_stderr "r6.json' already exists"
    expect_true "--report-json: the existing file is untouched" grep -qx old "$W/r6.json"
    expect_no_file "$W/out6"
    expect_exit 1 "$D" x.raw "$W/out6" "${RAW[@]}" --report-json "$W/nodir/r.json"
    expect_stderr "nodir"
    expect_no_file "$W/out6"
    # OUTPUT cannot be put in place (taken meanwhile): the report is withdrawn, the old one back.
    start_held out6 "$W/b6" /dev/null "$D" x.raw "$W/out6" "${RAW[@]}" --report-json "$W/r6.json" --force
    ln -s "$W/victim" "$W/out6"
    release "$W/b6"
    expect_held_exit 2
    expect_stderr "out6' exists and is a symbolic link"
    expect_true "the earlier report is back" grep -qx old "$W/r6.json"
    rm "$W/out6"
    # The report cannot be put in place (taken meanwhile): OUTPUT is not either.
    rm "$W/r6.json"
    start_held r6.json "$W/b6r" /dev/null "$D" x.raw "$W/out6" "${RAW[@]}" --report-json "$W/r6.json"
    echo mine >"$W/r6.json"
    release "$W/b6r"
    expect_held_exit 2
    expect_stderr "r6.json' already exists \(another process wrote it"
    expect_no_file "$W/out6"
    expect_true "the other process's report is kept" grep -qx mine "$W/r6.json"
    expect_exit 0 "$D" x.raw "$W/out6" "${RAW[@]}" --report-json "$W/r6.json" --force
    expect_true "--force: the report replaced" jq_true "$W/r6.json" '.samples == 100'
    no_leftovers "$W"
done
unset DSTK_TEST_NO_RENAMEAT2

# ---- 7. stdin, stdout, stderr closed: never an output's descriptor ----------
# From stdin the output is the first file opened: with stderr closed it took
# descriptor 2, and --progress wrote its text into the data.
expect_exit 0 "$D" x.raw ref7.npy "${RAW[@]}"
"$D" - o7.npy --from raw --shape 16 --in-dtype u8 --progress <x.raw >/dev/null 2>&-
expect_true "stderr closed, --progress, .npy from stdin: exit 0" test $? -eq 0
expect_same o7.npy ref7.npy
"$D" - o7.raw --to raw --from raw --shape 16 --in-dtype u8 --progress <x.raw >/dev/null 2>&-
expect_true "stderr closed, --progress, raw from stdin: exit 0" test $? -eq 0
expect_same o7.raw x.raw
expect_exit 0 "$D" x.raw ref7 "${RAW[@]}"
"$D" - o7 --from raw --shape 16 --in-dtype u8 --progress --json <x.raw >&- 2>&-
expect_true "stdout and stderr closed, --json, dataset from stdin: exit 0" test $? -eq 0
expect_same o7/train_x.npy ref7/train_x.npy
expect_exit 0 "$D" --verify o7
CHECKS=$((CHECKS + 1))
"$D" - o7b.npy "${RAW[@]}" >"$OUT" 2>"$ERR" <&-
[ $? -eq 1 ] || fail "stdin closed: expected exit 1"
expect_stderr "no samples arrived"
expect_no_file o7b.npy
no_leftovers .

finish
