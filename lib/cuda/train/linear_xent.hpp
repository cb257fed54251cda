#pragma once
// A classifier's last linear layer, its softmax cross-entropy and, in a
// training step, that layer's data gradient (through the ReLU whose output
// it reads, where one does) in one kernel: one warp per sample, one lane
// per class. At the end of a network such a layer is a small product (a few
// hundred inputs, a few classes): its forward GEMM, the loss kernel, the
// data-gradient GEMM and the ReLU's backward were four launches in a row on
// the step's critical path for very little arithmetic. The weight and bias
// gradients stay with the layer's backward (they read dz, written here).
//
// A block of eight samples stages the weights in shared memory while each
// warp loads its sample's inputs: the kernel is a few round trips to memory.
// Each logit is x . w summed in a fixed order (a lane's stride of the
// inputs, then the lanes in a fixed butterfly), each input gradient over the
// classes in order, in float: no atomics but the metrics counters, the same
// result on every run. z and dz are rounded to the activation type as stored
// before they are read again (as the loss kernel and the GEMM read them).
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "loss.hpp"

namespace dstk::train::cuda {

// The weights' bytes as float that a block stages in shared memory (within
// the default 48 KiB a block may take without opting in, beside the kernel's
// own arrays).
constexpr std::uint64_t linear_xent_max_weight_bytes = 40 * 1024;
// Whether the kernel takes a layer of these classes (1 to 32: a lane each) and
// inputs (the weights, classes x inputs as float, up to
// linear_xent_max_weight_bytes).
bool linear_xent_takes(std::uint32_t classes, std::uint32_t inputs);

struct LinearXentArgs {
    const void* x = nullptr;     // [n][in] the layer's input, in the activation type
    const void* w = nullptr;     // [k][in] its weights: float, or (w_act) the activation type
    bool w_act = false;          // w is a compute copy in the activation type
    const float* bias = nullptr; // k values, or null
    std::uint32_t in = 0;
    void* z = nullptr;      // [n][k] the layer's output (the logits)
    void* dx = nullptr;     // [n][in] the gradient of x (where the loss's dz is wanted), or null
    bool relu_mask = false; // x is a ReLU's output: dx is zero where x is not positive (the ReLU's backward)
};

// The loss's part is a's (a.loss == ce, linear_xent_takes(a.k, l.in); a.z is
// ignored: the logits go to l.z).
void launch_linear_xent(const HeadLossArgs& a, const LinearXentArgs& l, ActType t, cudaStream_t s);

} // namespace dstk::train::cuda
