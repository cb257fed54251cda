#pragma once
// What a head learns: the loss that compares its output with its target
// field, and what follows from it (the prediction the output stands for, the
// metrics reported). Plain enough for the CUDA kernels to include.
//
//   ce           softmax cross-entropy over K logits; the target is one integer
//                class in [0, K) per sample (label smoothing applies here only)
//   mse          mean squared error between the outputs and a float target of
//                the same number of values
//   poisson      Poisson negative log-likelihood, rate = softplus(output):
//                rate - y log(rate + 1e-8) (PyTorch's poisson_nll_loss, log_input False)
//   poisson-exp  the same with rate = exp(output): exp(output) - y output
//                (log_input True)
//   bce          binary cross-entropy with logits, one 0/1 target per output
//                (multi-label)
// Every loss is a mean over the head's outputs and the batch's samples, as
// PyTorch's losses reduce by default; a head's loss is multiplied by its weight
// and the heads' losses are summed.
#include <cstdint>
#include <string>
#include <string_view>

namespace dstk::train {

enum class LossKind : std::uint8_t { ce, mse, poisson, poisson_exp, bce };

LossKind parse_loss(std::string_view text, std::string_view setting); // usage error naming `setting` otherwise
std::string_view loss_name(LossKind k);
std::string loss_choices(); // "ce, mse, poisson, poisson-exp or bce"

} // namespace dstk::train
