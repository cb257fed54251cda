# Every kernel launched by launch_kernel() (programmatic dependent launch,
# lib/cuda/train/launch_common.cuh) waits for its predecessor before it touches
# memory (scripts/check-pdl-waits.py), after a check that the checker finds a
# kernel without the wait and a <<<>>> launch beside launch_kernel().
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 >/dev/null || skip "python3 is not installed"
check="$root/scripts/check-pdl-waits.py"

mkdir -p "$WORK/tree/lib/cuda"
cat >"$WORK/tree/lib/cuda/x.cu" <<'CU'
__global__ void waits(float* y) {
    await_predecessor();
    y[0] = 1.0f;
}
template <class T> __global__ void __launch_bounds__(256)
    eager(T* y) {
    y[0] = 1;
}
void run(float* y, cudaStream_t s) {
    launch_kernel(waits, 1, 1, 0, s, y);
    eager<float><<<1, 1, 0, s>>>(y);
}
CU
expect_exit 1 python3 "$check" --root "$WORK/tree"
expect_stdout '^lib/cuda/x.cu:5: kernel eager does not open with await_predecessor'
expect_stdout '^lib/cuda/x.cu:11: a <<<>>> launch in a file that uses launch_kernel'
expect_true "the kernel that waits is not listed" bash -c "! grep -q 'kernel waits' '$OUT'"

expect_exit 0 python3 "$check" --root "$root"
expect_stdout '^every kernel of the [0-9]+ files that use launch_kernel\(\) waits'
finish
