#pragma once
// Networks for dstrain: a spec string ("conv3x3:32,bn,relu,maxpool2,flatten,fc:10")
// or a preset name, planned against the dataset's per-sample shapes into a
// list of layers with their tensor shapes and their slices of one flat
// parameter vector. Both backends execute the same NetworkPlan, so parameters,
// gradients and checkpoints are interchangeable between them.
//
// Grammar (man/dstrain.1):
//   spec   := item ("," item)* ("," heads)?  |  heads
//   item   := layer | "res(" items ")"       residual: out = in + items(in)
//           | "side"                          the side input joins here (top level, once)
//   items  := item ("," item)*
//   layer  := "conv" K "x" K ":" C (":s" S | ":p" P | ":bias")*   (padding K/2 by default)
//           | "bn" | "relu" | "tanh" | "flatten" | "gap"            (gap: global average pool)
//           | ("maxpool" | "avgpool") K (":s" S)?                   (stride K by default)
//           | "fc:" N (":nobias")? | "dropout:" P
//   heads  := "heads(" head ("," " "* head)* ")"                     (the last item)
//   head   := NAME "=" items? ">" (LOSS ":")? FIELD ("*" WEIGHT)?
// e.g. "conv3x3:32,bn,relu,flatten,fc:512,relu,heads(policy=fc:4672>ce:moves, value=fc:1,tanh>mse:results*0.5)".
//
// The items before heads(...) are the trunk; each head reads the trunk's
// output and ends with its own prediction (flat: C x 1 x 1, or 1 x H x W). A
// spec without heads(...) is one head, the whole network, whose target and
// loss the caller gives (dstrain --label, --loss). A side input (a second
// field, e.g. f32[4] per sample) is normalised and concatenated to the flat
// features where "side" stands: placed by resolve_model before heads(...), or
// before the last fc of a spec without heads, when the spec has no "side".
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/dtype.hpp"
#include "dstk/shape.hpp"
#include "dstk/train/loss.hpp"

namespace dstk::train {

enum class LayerKind : std::uint8_t {
    conv,
    batchnorm,
    relu,
    tanh,
    maxpool,
    avgpool,
    global_avgpool,
    linear,
    flatten,
    dropout,
    residual_begin,
    residual_end,
    side, // concatenates the side input to its flat input
    head, // the start of a head: reads the trunk's output
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

// A head of heads(...): its name, target field, loss (when the spec gives
// one; else the default of the field's dtype, default_loss) and weight.
struct HeadSpec {
    std::string name, target;
    std::optional<LossKind> loss;
    float weight = 1.0f;

    bool operator==(const HeadSpec&) const = default;
};

struct ModelSpec {
    std::string name;              // preset name, or "custom"
    std::vector<LayerSpec> layers; // the trunk, then each head's `head` layer and its layers
    std::vector<HeadSpec> heads;   // one per `head` layer; empty: the spec has no heads(...)
};

// Throws a usage error naming the offending item and its position.
ModelSpec parse_model_spec(std::string_view text);
// Canonical spec string; parse_model_spec(to_spec_string(m)) == m.
std::string to_spec_string(const ModelSpec& m);

// "ref-cnn", "small-cnn", "resnet9", "mlp" (default widths 1024,512) or
// "mlp:W1,W2,...": the final "fc:<outputs>" is appended for the dataset.
// Anything else is parsed as a spec.
ModelSpec resolve_model(std::string_view name_or_spec, std::uint32_t outputs);
std::vector<std::string> preset_names();

// NCHW per sample. Inputs of one dimension D are D x 1 x 1; of two, 1 x H x W.
struct TensorShape {
    std::uint32_t c = 0, h = 0, w = 0;
    std::uint64_t numel() const { return std::uint64_t{c} * h * w; }
    std::string str() const;
    bool operator==(const TensorShape&) const = default;
};
TensorShape tensor_shape_from(const Shape& sample_shape);

// What a head learns from: its target field as the data holds it, and the
// loss. width: the outputs the head must end with: for ce the classes (0:
// whatever the network gives, at least 2; labels outside are runtime errors),
// else the field's values per sample.
struct Target {
    std::string field;
    DType dtype = DType::i32;
    Shape shape;
    LossKind loss = LossKind::ce;
    std::uint32_t width = 0;

    bool operator==(const Target&) const = default;
};

// The loss a target field gets when none is given: ce for one integer per
// sample, mse otherwise.
LossKind default_loss(DType dtype, const Shape& shape);
// Usage error when `loss` cannot learn a field of this dtype and shape (ce on
// floats or on several values per sample), or of this many classes as the
// dataset declares them (bce, which learns 0 or 1, on more than 2), naming
// the field and the fix. Values the data holds are checked as they are read
// (head_loss: a ce label outside its classes, a bce target neither 0 nor 1).
void check_loss_fits(LossKind loss, const std::string& field, DType dtype, const Shape& shape,
                     std::optional<std::uint32_t> classes = std::nullopt);

// A field as the data holds it, for resolve_model. classes: the dataset's
// class count where the field is its labels.
struct FieldFacts {
    DType dtype = DType::f32;
    Shape shape;
    std::optional<std::uint32_t> classes;
};
using FieldLookup = std::function<std::optional<FieldFacts>(const std::string& field)>;

struct ModelRequest {
    std::string model = "ref-cnn"; // preset or spec
    std::string input;             // the input field (neither a target nor the side input)
    std::string label;             // the target of a model without heads(...)
    std::optional<LossKind> loss;  // its loss (default: default_loss of the label)
    std::string side;              // the side input's field, or empty
    std::string fields_known;      // for messages: the fields the data has ("x, y, results")
};
struct ResolvedModel {
    ModelSpec spec;              // every head's loss set; "side" placed where the side input joins
    std::vector<Target> targets; // one per head (one for a spec without heads(...))
    std::uint32_t side = 0;      // the side input's values per sample (0: none)
};
// The model a request names, against the data's fields: presets end in the
// label's width, every head's target is looked up and its loss checked,
// the side input is placed. Usage errors name the option or spec item to fix.
ResolvedModel resolve_model(const ModelRequest& request, const FieldLookup& fields);

// The side input's conversion: its field, stored dtype and normalisation
// (per channel of tensor_shape_from(its shape), in stored units).
struct SideInput {
    std::string field; // empty: the model has no side input
    DType dtype = DType::f32;
    std::vector<float> mean, std;
};

struct LayerPlan {
    LayerSpec spec;
    TensorShape in, out;
    std::int32_t source = -1; // the layer whose output this one reads (-1: the normalised input)
    std::uint64_t param_offset = 0,
                  param_count = 0; // conv: W[out][in][k][k] then b; fc: W[out][in] then b; bn: gamma, beta
    std::uint64_t state_offset = 0, state_count = 0; // bn: running mean, running var
    std::int32_t partner = -1;                       // residual_begin <-> residual_end
};

struct HeadPlan {
    std::string name; // "" for the one head of a spec without heads(...)
    Target target;
    float weight = 1.0f;
    std::int32_t begin = -1;  // its `head` layer (-1: none; the whole network is the head)
    std::uint32_t output = 0; // the layer whose output is the head's prediction, target.width values
};

struct NetworkPlan {
    std::string name;
    TensorShape input;
    std::uint32_t side = 0; // side input values per sample (0: none)
    std::vector<LayerPlan> layers;
    std::vector<HeadPlan> heads; // at least one
    std::uint64_t params = 0, states = 0;

    // The layer whose output every `head` layer reads (-1: none, or the input).
    std::int32_t trunk_end() const;
    std::uint64_t max_activation() const; // largest per-sample numel of any tensor
    // Floating-point operations per sample in the network's matrix products
    // (2 per multiply-add of its convolutions and linear layers; norms,
    // activations, pools and losses not counted): a forward pass, and a
    // training step's forward, data gradients (none for a layer that reads
    // the input: nothing needs it) and weight gradients.
    std::uint64_t forward_flops() const;
    std::uint64_t training_flops() const;
    std::string summary() const; // one line per layer
};

// Usage error when the spec does not fit the input and targets (a pool larger
// than the image, an output that is not the target's width, an unclosed
// residual, a "side" without a side input ...). `targets` has one entry per
// head of the spec (one for a spec without heads(...)).
NetworkPlan plan_network(const ModelSpec& m, TensorShape input, const std::vector<Target>& targets,
                         std::uint32_t side = 0);
// One softmax cross-entropy head of `classes` classes on the field "y".
NetworkPlan plan_network(const ModelSpec& m, TensorShape input, std::uint32_t classes);

// Deterministic initialisation from the seed (PyTorch's defaults: weights and
// biases uniform in +-1/sqrt(fan_in), BN gamma 1, beta 0, running var 1).
void init_parameters(const NetworkPlan& plan, std::uint64_t seed, std::span<float> params, std::span<float> states);

} // namespace dstk::train
