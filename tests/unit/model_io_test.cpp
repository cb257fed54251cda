// Saved models: the safetensors codec, the PyTorch names and layouts, the
// metadata round trip, the checks on damaged files, and the Predictor's
// logits against a hand computation.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "dstk/error.hpp"
#include "dstk/model/infer.hpp"
#include "dstk/model/onnx.hpp"
#include "dstk/model/saved_model.hpp"
#include "support/error_of.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using test_support::code_of;
using test_support::error_of;
using namespace dstk::model;

namespace {

SavedModel sample_model(const std::string& spec, train::TensorShape input, std::uint32_t classes) {
    SavedModel m;
    m.spec = train::resolve_model(spec, classes);
    m.input = input;
    m.targets = classifier_targets(classes);
    m.input_dtype = DType::u8;
    m.mean.assign(input.c, 10.0f);
    m.std.assign(input.c, 4.0f);
    m.precision = "fp32";
    m.dataset = "data";
    m.dataset_checksum = "xxh64:0123456789abcdef";
    m.steps = 42;
    const auto plan = m.plan();
    m.params.resize(plan.params);
    m.states.resize(plan.states);
    for (std::size_t i = 0; i < m.params.size(); ++i) m.params[i] = std::sin(0.37f * static_cast<float>(i));
    for (std::size_t i = 0; i < m.states.size(); ++i) m.states[i] = 0.5f + 0.01f * static_cast<float>(i);
    return m;
}

} // namespace

TEST(ModelIo, SafetensorsRoundTripAndLayout) {
    TensorFile f;
    const float v[] = {1, 2, 3, 4, 5, 6};
    f.tensors.push_back(f32_tensor("a.weight", {2, 3}, v));
    f.tensors.push_back(i64_scalar("a.count", 7));
    f.metadata = {{"k", "v"}};
    const auto bytes = encode_safetensors(f);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << "data must start on an 8-byte boundary";
    EXPECT_EQ(bytes.size(), 8 + n + 24 + 8);
    const TensorFile g = decode_safetensors(bytes, "t");
    ASSERT_EQ(g.tensors.size(), 2u);
    EXPECT_EQ(g.find("a.weight")->floats(), std::vector<float>(v, v + 6));
    EXPECT_EQ(g.find("a.count")->shape.size(), 0u);
    EXPECT_EQ(g.metadata.at("k"), "v");
}

TEST(ModelIo, SafetensorsRejectsDamage) {
    TensorFile f;
    const float v[] = {1, 2, 3, 4};
    f.tensors.push_back(f32_tensor("w", {4}, v));
    auto bytes = encode_safetensors(f);
    auto truncated = bytes;
    truncated.pop_back();
    EXPECT_EQ(code_of([&] { decode_safetensors(truncated, "t"); }), ExitCode::failure);
    auto longer = bytes;
    longer.push_back(0);
    EXPECT_EQ(code_of([&] { decode_safetensors(longer, "t"); }), ExitCode::failure);
    auto huge = bytes;
    huge[7] = 0x7f;
    EXPECT_EQ(code_of([&] { decode_safetensors(huge, "t"); }), ExitCode::failure);
    EXPECT_EQ(code_of([&] { decode_safetensors(std::vector<std::uint8_t>(3), "t"); }), ExitCode::failure);
}

TEST(ModelIo, PyTorchNamesAndShapes) {
    const SavedModel m = sample_model("conv3x3:4,bn,relu,res(conv3x3:4:bias,bn,relu),gap,flatten,fc:3", {2, 6, 6}, 3);
    const TensorFile f = to_tensor_file(m);
    ASSERT_NE(f.find("0.weight"), nullptr);
    EXPECT_EQ(f.find("0.weight")->shape, (std::vector<std::uint64_t>{4, 2, 3, 3}));
    EXPECT_EQ(f.find("1.running_var")->shape, (std::vector<std::uint64_t>{4}));
    ASSERT_NE(f.find("1.num_batches_tracked"), nullptr);
    EXPECT_NE(f.find("3.body.0.bias"), nullptr);
    EXPECT_NE(f.find("3.body.1.running_mean"), nullptr);
    EXPECT_EQ(f.find("6.weight")->shape, (std::vector<std::uint64_t>{3, 4}));
    EXPECT_EQ(f.find("0.bias"), nullptr);
    // The first conv's weights are the first values of the parameter vector, in order.
    const auto w = f.find("0.weight")->floats();
    EXPECT_EQ(w[5], m.params[5]);
    EXPECT_EQ(f.metadata.at("model"), "conv3x3:4,bn,relu,res(conv3x3:4:bias,bn,relu),gap,flatten,fc:3");
    EXPECT_EQ(f.metadata.at("normalize_mean"), "[10.0,10.0]");
}

TEST(ModelIo, MetadataRoundTripAndChecks) {
    const SavedModel m = sample_model("small-cnn", {1, 8, 8}, 4);
    const SavedModel r = from_tensor_file(to_tensor_file(m), "t");
    EXPECT_EQ(r.params, m.params);
    EXPECT_EQ(r.states, m.states);
    EXPECT_EQ(r.steps, 42u);
    EXPECT_EQ(r.spec.name, "small-cnn");
    EXPECT_EQ(r.input, m.input);
    EXPECT_EQ(r.mean, m.mean);
    EXPECT_EQ(r.input_dtype, DType::u8);

    TensorFile f = to_tensor_file(m);
    f.tensors.pop_back();
    EXPECT_EQ(code_of([&] { from_tensor_file(f, "t"); }), ExitCode::failure);
    f = to_tensor_file(m);
    f.metadata.erase("model");
    EXPECT_EQ(code_of([&] { from_tensor_file(f, "t"); }), ExitCode::failure);
    f = to_tensor_file(m);
    f.tensors.push_back(i64_scalar("extra", 1));
    EXPECT_EQ(code_of([&] { from_tensor_file(f, "t"); }), ExitCode::failure);

    const auto other = train::plan_network(train::resolve_model("small-cnn", 5), {1, 8, 8}, 5);
    EXPECT_EQ(code_of([&] { check_same_network(m, other, "t"); }), ExitCode::usage);
    EXPECT_EQ(code_of([&] { check_same_network(m, m.plan(), "t"); }), ExitCode::ok);
}

TEST(ModelIo, SaveRefusesExistingAndUnknownExtension) {
    const fs::path d = fs::path(::testing::TempDir()) / ("dstk_model_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    const SavedModel m = sample_model("mlp:8", {3, 1, 1}, 2);
    save_model(d / "m.safetensors", m, false);
    EXPECT_EQ(code_of([&] { save_model(d / "m.safetensors", m, false); }), ExitCode::usage);
    EXPECT_EQ(code_of([&] { save_model(d / "m.safetensors", m, true); }), ExitCode::ok);
    EXPECT_EQ(code_of([&] { save_model(d / "m.bin", m, false); }), ExitCode::usage);
    fs::create_directories(d / "dir.safetensors");
    EXPECT_EQ(code_of([&] { save_model(d / "dir.safetensors", m, true); }), ExitCode::usage);
    EXPECT_EQ(load_model(d / "m.safetensors").params, m.params);
    fs::remove_all(d);
}

TEST(ModelIo, OnnxStartsLikeAModelProto) {
    const auto bytes = encode_onnx(sample_model("small-cnn", {1, 8, 8}, 4));
    ASSERT_GT(bytes.size(), 100u);
    EXPECT_EQ(bytes[0], 0x08); // field 1 (ir_version), varint
    EXPECT_EQ(bytes[1], 7);
}

TEST(ModelIo, PredictorLogitsMatchAHandComputation) {
    // flatten,fc:2 on 3 inputs: logits = W (x - mean) / std + b.
    SavedModel m = sample_model("flatten,fc:2", {3, 1, 1}, 2);
    const std::uint8_t x[] = {14, 6, 30, 10, 10, 10};
    InferenceOptions o;
    o.device = dstk::Device{dstk::Backend::cpu, 0};
    o.batch = 4;
    Predictor p(m, DataTypes{DType::u8, {}, {}}, o, OutputOptions{true, false, false});
    const void* data[] = {x, nullptr};
    const auto outputs = p.outputs(data, 2);
    ASSERT_EQ(outputs.size(), 1u);
    const auto& logits = outputs[0];
    ASSERT_EQ(logits.size(), 4u);
    for (int s = 0; s < 2; ++s)
        for (int k = 0; k < 2; ++k) {
            double v = m.params[6 + k];
            for (int i = 0; i < 3; ++i) v += m.params[k * 3 + i] * (x[s * 3 + i] - 10.0) / 4.0;
            EXPECT_NEAR(logits[s * 2 + k], v, 1e-5);
        }
}

namespace {

// Two heads on a trunk with a side input of 4 values.
SavedModel heads_model() {
    SavedModel m;
    m.spec =
        train::parse_model_spec("flatten,fc:8,relu,side,heads(policy=fc:5>ce:moves,value=fc:1,tanh>mse:results*0.5)");
    m.input = {3, 2, 2};
    m.input_dtype = DType::f32;
    m.targets = {{"moves", DType::i32, Shape{}, train::LossKind::ce, 5},
                 {"results", DType::i8, Shape{}, train::LossKind::mse, 1}};
    m.side = {"behavior", DType::f32, {0.5f, 1.0f, 1.5f, 2.0f}, {1.0f, 2.0f, 3.0f, 4.0f}};
    m.side_values = 4;
    m.mean.assign(3, 0.0f);
    m.std.assign(3, 1.0f);
    m.precision = "fp32";
    m.steps = 3;
    const auto plan = m.plan();
    m.params.resize(plan.params);
    for (std::size_t i = 0; i < m.params.size(); ++i) m.params[i] = std::cos(0.1f * static_cast<float>(i));
    return m;
}

} // namespace

TEST(ModelIo, HeadsHaveTheirPyTorchNamesAndMetadata) {
    const SavedModel m = heads_model();
    const TensorFile f = to_tensor_file(m);
    ASSERT_NE(f.find("1.weight"), nullptr);
    EXPECT_EQ(f.find("1.weight")->shape, (std::vector<std::uint64_t>{8, 12}));
    EXPECT_EQ(f.find("heads.policy.0.weight")->shape, (std::vector<std::uint64_t>{5, 12})); // 8 features + 4 side
    EXPECT_EQ(f.find("heads.value.0.bias")->shape, (std::vector<std::uint64_t>{1}));
    EXPECT_EQ(f.tensors.size(), 6u);
    EXPECT_EQ(f.metadata.at("format_version"), "2");
    EXPECT_EQ(f.metadata.count("classes"), 0u);
    EXPECT_NE(f.metadata.at("heads").find("\"loss\":\"mse\""), std::string::npos);
    EXPECT_NE(f.metadata.at("side_input").find("\"field\":\"behavior\""), std::string::npos);
    const SavedModel r = from_tensor_file(f, "t");
    EXPECT_EQ(r.targets, m.targets);
    EXPECT_EQ(r.side.field, "behavior");
    EXPECT_EQ(r.side.std, m.side.std);
    EXPECT_EQ(r.side_values, 4u);
    EXPECT_EQ(train::to_spec_string(r.spec), train::to_spec_string(m.spec));
    EXPECT_EQ(r.params, m.params);
    EXPECT_EQ(code_of([&] { check_same_network(r, m.plan(), "t"); }), ExitCode::ok);
    // Another loss on the same layers is another network.
    SavedModel other = m;
    other.spec.heads[1].loss = train::LossKind::poisson;
    other.targets[1].loss = train::LossKind::poisson;
    EXPECT_NE(error_of([&] { check_same_network(m, other.plan(), "t"); }).find("loss of head value mse in the file"),
              std::string::npos);
    // A damaged "heads" entry is a runtime error naming it.
    TensorFile g = f;
    g.metadata["heads"] = "[{\"target\": 3}]";
    EXPECT_NE(error_of([&] { from_tensor_file(g, "t"); }).find("metadata 'heads'"), std::string::npos);
    EXPECT_EQ(code_of([&] { encode_onnx(m); }), ExitCode::ok);
}

TEST(ModelIo, ClassifiersStayVersionOne) {
    const SavedModel m = sample_model("small-cnn", {1, 8, 8}, 4);
    TensorFile f = to_tensor_file(m);
    EXPECT_EQ(f.metadata.at("format_version"), "1");
    EXPECT_EQ(f.metadata.at("classes"), "4");
    // A file of an earlier dstrain: no "heads"; the target is the dataset's label role.
    f.metadata.erase("heads");
    const SavedModel r = from_tensor_file(f, "t");
    ASSERT_EQ(r.targets.size(), 1u);
    EXPECT_EQ(r.targets[0].field, "");
    EXPECT_EQ(r.targets[0].width, 4u);
    EXPECT_EQ(r.targets[0].loss, train::LossKind::ce);
}
