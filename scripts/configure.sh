# Sourced by scripts/test.sh and scripts/demo.sh: configures build/ the one way
# both share, so that either reuses what the other built.
#   - ccache as the compiler launcher where it is installed (a fresh clone on a
#     machine that built before, as CI after a session, compiles little);
#   - CUDA architectures: DSTK_CUDA_ARCHS, else the project's 80;86;89;90 where
#     a GPU is present, else 90 alone: without a GPU the GPU code is compiled
#     as a check and never run, and four architectures were most of the build
#     on two cores.
# Sets `launcher` (the launcher options, for other builds) and prints the
# configure's "dstk:" lines; the whole log is build-configure.log.
launcher=()
if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} # hits across clones in other folders
fi
configure_args=(-DCMAKE_BUILD_TYPE=Release "${launcher[@]}")
if [ -n "${DSTK_CUDA_ARCHS:-}" ]; then
    configure_args+=("-DCMAKE_CUDA_ARCHITECTURES=${DSTK_CUDA_ARCHS}")
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    configure_args+=("-DCMAKE_CUDA_ARCHITECTURES=80;86;89;90")
else
    configure_args+=("-DCMAKE_CUDA_ARCHITECTURES=90")
fi
cmake -S . -B build "${configure_args[@]}" >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
grep -E '^-- dstk:' build-configure.log || true
