#!/usr/bin/env bash
# The man pages' EXAMPLES, run as written, in order, page by page, each page in
# a fresh directory, on small data: every command line of the section (roff
# .nf/.fi and .EX/.EE blocks, and .B lines) runs through bash with the tools on
# PATH. Placeholders the pages name get small fixtures; large sizes shrink by
# the explicit rewrites below, and dstrain runs 1 epoch on 2 CPU threads. Lines
# that cannot run here are listed in SKIP with the reason; a line in neither
# list that fails, fails the test.
source "$(dirname "$0")/lib.sh"
need_doc_tools "dsconvert's IDX examples"
MAN="$(cd "$(dirname "$0")/../../man" && pwd)"
SCRIPTS="$(cd "$(dirname "$0")/../../scripts" && pwd)"
# 'producer' stands for any program writing raw samples: 64 u8 3x32x32 ones.
mkdir -p "$WORK/bin"
printf '#!/bin/sh\nhead -c 196608 /dev/urandom\n' >"$WORK/bin/producer"
chmod +x "$WORK/bin/producer"
export PATH="$BIN:$WORK/bin:$PATH"

# Lines that cannot run on this machine (substring match), with the reason.
SKIP=(
    "sudo dsbench" # needs root and sudo to drop the page cache
)
# dsbench's h2d cases need a GPU: without one they are waived (exit 3).
[ -e /dev/nvidia0 ] || SKIP+=("--cases h2d.pinned,h2d.pageable")
command -v fio >/dev/null || SKIP+=("scripts/fio-compare.sh") # needs fio, not installed here
SKIP+=("srun ") # needs a Slurm cluster
command -v mpirun >/dev/null || SKIP+=("mpirun ") # needs Open MPI (scripts/setup.sh)
# dsbench compare --plot draws with a python that has matplotlib (scripts/setup.sh --test).
PLOT_PY=$(plot_python)
if [ -n "$PLOT_PY" ]; then export DSTK_PYTHON=$PLOT_PY; else SKIP+=("--plot "); fi
# mpirun as root in CI's container, with more ranks than its 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# Small sizes for big ones; every dstrain line trains 1 epoch on 2 CPU threads;
# (eval and predict keep their lines); dsbench measures once, briefly, on 4 MiB (as its own tests do).
rewrite() {
    sed -E -e 's/--train (1M|10M|100K|50K)/--train 1K/' -e '/dsgen /s/--test 10K/--test 256/' \
        -e 's/--kind bytes --shape 1048576 --train 10K/--kind bytes --shape 4096 --train 64/' \
        -e "$DSTRAIN_ONE_EPOCH" \
        -e 's/(dsbench all( [^ -][^ ]*)?)/\1 --repetitions 1 --min-time 0 --size 4M/g' <<<"$1"
}

# The command lines of one page's EXAMPLES: roff escapes undone, continued
# lines joined, comments off.
examples() {
    awk '/^\.SH EXAMPLES/{e=1;next} /^\.SH/{e=0} !e{next}
         /^\.(nf|EX)/{b=1;next} /^\.(fi|EE)/{b=0;next}
         b&&!/^\./{print;next} /^\.B /{sub(/^\.B /,"");print}' "$MAN/$1.1" |
        sed -E -e 's/\\-/-/g' -e 's/\\e/\\/g' | sed -e ':a' -e '/\\$/{N;s/\\\n[[:space:]]*/ /;ba' -e '}' |
        strip_shell_comments
}

# Fixtures each page names, made in its fresh directory.
fixtures() {
    case $1 in
    dsbench)
        mkdir -p data && ln -s "$SCRIPTS" scripts
        dsgen data/cifar-u8 --train 512 --test 64 --shape 3x16x16 --dtype u8 -q
        dsgen data/big --train 256 --test 0 --shape 3x16x16 -q
        dsbench all data/big --cases io.seq --repetitions 1 --min-time 0 --json old.json -q >/dev/null &&
            cp old.json new.json ;;
    dsconvert)
        mkdir -p data/mnist && ln -s "$MNIST"/t10k-*.gz data/mnist/ && ln -s "$MNIST"/t10k-*.gz .
        dsgen big/ --train 256 --test 64 --shape 3x16x16 --dtype f32 -q
        dsgen cifar/ --train 256 --test 64 --shape 3x16x16 --dtype u8 -q
        dsgen huge/ --train 512 --test 64 --shape 3x16x16 --dtype u8 -q
        make_npz_fixtures '
np.savez("images.npz", r.integers(0, 256, (100, 8, 8, 3)).astype(np.uint8))
np.savez("labels.npz", r.integers(0, 10, 100).astype(np.int64))
r.integers(0, 256, 1 << 20).astype(np.uint8).tofile("data.raw")
n = 64
np.savez("chess.npz", positions=r.integers(-1, 2, (n, 12, 8, 8)).astype(np.int8),
         moves=r.integers(0, 4672, n).astype(np.int32), results=r.integers(-1, 2, n).astype(np.int8))
for rec in ("rec1", "rec2"):
    np.savez(rec + ".npz", stim=r.integers(0, 256, (n, 1, 36, 36)).astype(np.uint8),
             robs=r.random((n, 120), dtype=np.float32), behavior=r.random((n, 4), dtype=np.float32))
import os; os.mkdir("arrays")
np.save("arrays/positions_train.npy", r.integers(-1, 2, (n, 12, 8, 8)).astype(np.int8))
np.save("arrays/moves_train.npy", r.integers(0, 4672, n).astype(np.int32))
' ;;
    dstrain) # samples for predict, the shape of the page's dataset
        "$PY" -c 'import numpy as np; np.save("samples.npy", np.random.default_rng(1).integers(0, 256, (8, 3, 32, 32)).astype(np.uint8))' ;;
    dsplan)
        dsgen data/ --train 512 --test 64 --shape 3x16x16 --dtype u8 -q
        dsgen data2/ --train 256 --test 32 --shape 3x16x16 --dtype u8 --seed 2 -q ;;
    esac
}

for page in dsgen dsconvert dsplan dsbench dstrain; do
    mapfile -t LINES < <(examples "$page")
    expect_true "man/$page.1 EXAMPLES has command lines" test "${#LINES[@]}" -gt 0
    mkdir -p "$WORK/$page"
    cd "$WORK/$page" || exit 1
    fixtures "$page"
    for line in "${LINES[@]}"; do
        run_doc_line "$line" && echo "ran ($page): $DOC_CMD"
    done
done

finish
