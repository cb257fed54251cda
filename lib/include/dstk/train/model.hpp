#pragma once
// Networks for dstrain: a spec string ("conv3x3:32,bn,relu,maxpool2,flatten,fc:10")
// or a preset name, planned against the dataset's per-sample shape into a list
// of layers with their tensor shapes and their slices of one flat parameter
// vector. Both backends execute the same NetworkPlan, so parameters, gradients
// and checkpoints are interchangeable between them.
//
// Grammar (man/dstrain.1):
//   spec   := item ("," item)*
//   item   := layer | "res(" spec ")"        residual: out = in + spec(in)
//   layer  := "conv" K "x" K ":" C (":s" S | ":p" P | ":bias")*   (padding K/2 by default)
//           | "bn" | "relu" | "flatten" | "gap"                     (gap: global average pool)
//           | ("maxpool" | "avgpool") K (":s" S)?                   (stride K by default)
//           | "fc:" N (":nobias")? | "dropout:" P
// The network ends with logits (numel == classes); softmax cross-entropy is
// the loss, always.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/shape.hpp"

namespace dstk::train {

enum class LayerKind : std::uint8_t {
    conv,
    batchnorm,
    relu,
    maxpool,
    avgpool,
    global_avgpool,
    linear,
    flatten,
    dropout,
    residual_begin,
    residual_end,
};

std::string_view layer_kind_name(LayerKind k);

struct LayerSpec {
    LayerKind kind = LayerKind::relu;
    std::uint32_t kernel = 0, stride = 1, padding = 0; // conv, pools
    std::uint32_t out = 0;                             // conv channels, fc features
    bool bias = false;                                 // conv (default off), fc (default on)
    float drop = 0.0f;                                 // dropout probability

    bool operator==(const LayerSpec&) const = default;
};

struct ModelSpec {
    std::string name; // preset name, or "custom"
    std::vector<LayerSpec> layers;
};

// Throws a usage error naming the offending item and its position.
ModelSpec parse_model_spec(std::string_view text);
// Canonical spec string; parse_model_spec(to_spec_string(m)) == m.
std::string to_spec_string(const ModelSpec& m);

// "ref-cnn", "small-cnn", "resnet9", "mlp" (default widths 1024,512) or
// "mlp:W1,W2,...": the final "fc:<classes>" is appended for the dataset.
// Anything else is parsed as a spec.
ModelSpec resolve_model(std::string_view name_or_spec, std::uint32_t classes);
std::vector<std::string> preset_names();

// NCHW per sample. Inputs of one dimension D are D x 1 x 1; of two, 1 x H x W.
struct TensorShape {
    std::uint32_t c = 0, h = 0, w = 0;
    std::uint64_t numel() const { return std::uint64_t{c} * h * w; }
    std::string str() const;
    bool operator==(const TensorShape&) const = default;
};
TensorShape tensor_shape_from(const Shape& sample_shape);

struct LayerPlan {
    LayerSpec spec;
    TensorShape in, out;
    std::uint64_t param_offset = 0,
                  param_count = 0; // conv: W[out][in][k][k] then b; fc: W[out][in] then b; bn: gamma, beta
    std::uint64_t state_offset = 0, state_count = 0; // bn: running mean, running var
    std::int32_t partner = -1;                       // residual_begin <-> residual_end
};

struct NetworkPlan {
    std::string name;
    TensorShape input;
    std::uint32_t classes = 0;
    std::vector<LayerPlan> layers;
    std::uint64_t params = 0, states = 0;

    std::uint64_t max_activation() const; // largest per-sample numel of any tensor
    std::string summary() const;          // one line per layer
};

// Usage error when the spec does not fit the input (a pool larger than the
// image, logits that are not `classes` wide, an unclosed residual ...).
NetworkPlan plan_network(const ModelSpec& m, TensorShape input, std::uint32_t classes);

// Deterministic initialisation from the seed (PyTorch's defaults: weights and
// biases uniform in +-1/sqrt(fan_in), BN gamma 1, beta 0, running var 1).
void init_parameters(const NetworkPlan& plan, std::uint64_t seed, std::span<float> params, std::span<float> states);

} // namespace dstk::train
