#pragma once
// A trained model as a file a user can take elsewhere (DESIGN.md, "What a run
// leaves behind"; man dstk-format): safetensors whose tensor names and layouts
// are those of the equivalent PyTorch module, so that
// `module.load_state_dict(safetensors.torch.load_file(F))` works, and whose
// metadata says how to feed it (model spec, input shape and dtype, per-channel
// normalisation, each head's target and loss, the side input and its
// normalisation) and where it came from (dstk version, dataset checksum,
// steps, precision). An .onnx file is an export of the same model for other
// runtimes (model/onnx.hpp).
//
// PyTorch names: the trunk is numbered as an nn.Sequential with one module per
// spec item, from 0 ("0.weight" for a first conv); res(...) is one item, a
// module whose body is an nn.Sequential ("3.body.0.weight"); "side" takes a
// number and has no tensors. Each head of heads(...) is an nn.Sequential of
// its own items under "heads.NAME" ("heads.policy.0.weight"). conv: weight
// [out, in, k, k] (+ bias [out]); fc: weight [out, in] (+ bias); bn: weight,
// bias, running_mean, running_var [C] and num_batches_tracked (i64 scalar,
// the optimiser steps taken). dstk's parameter vector holds these same
// layouts (NCHW weights, [out][in] matrices, flatten in C,H,W order).
//
// Format version 1 is a classifier (one ce head, no side input, no layer
// newer than it); everything else is version 2, whose "heads" and
// "side_input" metadata a version-1 reader does not know.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dstk/dtype.hpp"
#include "dstk/model/safetensors.hpp"
#include "dstk/train/model.hpp"

namespace dstk::model {

inline constexpr const char* default_model_file = "model.safetensors";

struct SavedModel {
    train::ModelSpec spec; // name: the preset, or "custom"
    train::TensorShape input;
    DType input_dtype = DType::f32; // the training data's stored dtype: mean and std are in its units
    // One per head. A version-1 file records no target field: "" stands for
    // the dataset's label role.
    std::vector<train::Target> targets;
    std::vector<float> mean, std;  // per input channel: x' = (x - mean) / std
    train::SideInput side;         // field empty: none
    std::uint32_t side_values = 0; // per sample
    std::string precision;         // what it was trained in: fp32, tf32, bf16
    std::string dstk_version = DSTK_VERSION;
    std::string dataset, dataset_checksum; // the training split's input field
    std::uint64_t steps = 0;
    std::vector<float> params, states; // NetworkPlan order (train/model.hpp)

    train::NetworkPlan plan() const; // usage error if the spec does not fit input and targets
};

// One softmax cross-entropy head of `classes` classes on the dataset's label role.
std::vector<train::Target> classifier_targets(std::uint32_t classes);

// The PyTorch module path of each layer ("0", "3.body.1", "heads.value.0");
// empty for residual_end, which has no module of its own.
std::vector<std::string> module_paths(const train::NetworkPlan& plan);

TensorFile to_tensor_file(const SavedModel& m);
SavedModel from_tensor_file(const TensorFile& f, const std::string& source);

// The file's bytes by the extension of `path`: .safetensors, or .onnx
// (model/onnx.hpp); a usage error for any other.
std::vector<std::uint8_t> encode_model(const std::filesystem::path& path, const SavedModel& m);
// Writes by the extension. Refuses an existing file without `force` (usage
// error); atomic (atomic_output.hpp).
void save_model(const std::filesystem::path& path, const SavedModel& m, bool force);
// Usage error when `path` exists and is not a regular file (a directory, a
// link, a device): nothing else is ever replaced.
void check_replaceable(const std::filesystem::path& path);
// Reads a .safetensors written by save_model; runtime errors name the file
// and what is missing or inconsistent, or the first tensor holding NaN or Inf.
SavedModel load_model(const std::filesystem::path& path);

// Usage error when `m` cannot stand in for a network planned as `plan` (other
// spec, input shape, targets' widths and losses, side input), naming the
// difference.
void check_same_network(const SavedModel& m, const train::NetworkPlan& plan, const std::string& source);

} // namespace dstk::model
