#include "dstk/train/trainer.hpp"

#include <cstdio>
#include <cstring>
#include <string>

#include "backends.hpp"
#include "dstk/error.hpp"
#include "dstk/enum_names.hpp"

namespace dstk::train {

namespace {
constexpr EnumNames<Precision, 3> precision_names{
    {{{Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::bf16, "bf16"}}}};
} // namespace

Precision parse_precision(std::string_view text) {
    return precision_names.parse(text, "--precision");
}

std::string_view precision_name(Precision p) {
    return precision_names.name(p);
}

bool is_input_dtype(DType t) {
    return t == DType::u8 || t == DType::bf16 || t == DType::f16 || t == DType::f32;
}

void validate_config(const TrainerConfig& c) {
    if (c.max_batch == 0 || c.max_batch > (1u << 20))
        throw usage_error("invalid batch size " + std::to_string(c.max_batch) + " (must be 1 to 1048576)");
    if (!is_input_dtype(c.input_dtype))
        throw usage_error("input dtype " + std::string(dtype_name(c.input_dtype)) +
                          " is not supported for training (convert to u8, bf16, f16 or f32 with dsconvert)");
    if (c.mean.size() != c.plan.input.c || c.std.size() != c.plan.input.c)
        throw usage_error("normalisation needs " + std::to_string(c.plan.input.c) + " per-channel means and stds");
    for (const float s : c.std)
        if (!(s > 0.0f)) throw usage_error("normalisation std must be positive (a constant channel?)");
    if (!(c.label_smoothing >= 0.0f && c.label_smoothing < 1.0f))
        throw usage_error("invalid --label-smoothing (must be in [0, 1))");
    if (!(c.optimizer.lr > 0.0f)) throw usage_error("invalid --lr (must be positive)");
    if (c.plan.params > (std::uint64_t{1} << 31)) throw usage_error("model has more than 2^31 parameters");
}

Batch step_batch(const TrainerConfig& c, const void* x, const std::int32_t* y, std::uint32_t size) {
    const TensorShape in = c.plan.input;
    Batch b;
    b.size = size;
    b.fields.push_back({c.input_field, c.input_dtype, Shape{{in.c, in.h, in.w}}, x});
    b.fields.push_back({c.label_field, DType::i32, Shape{}, y});
    return b;
}

StepFields step_fields(const TrainerConfig& c, const Batch& b) {
    if (b.size == 0 || b.size > c.max_batch)
        throw usage_error("batch of " + std::to_string(b.size) + " samples (the trainer was planned for 1 to " +
                          std::to_string(c.max_batch) + ")");
    const BatchField& x = b.field(c.input_field);
    const BatchField& y = b.field(c.label_field);
    if (x.dtype != c.input_dtype || x.shape.numel() != c.plan.input.numel())
        throw usage_error("batch field '" + x.name + "' is " + std::string(dtype_name(x.dtype)) + " " + x.shape.str() +
                          " but the model takes " + std::string(dtype_name(c.input_dtype)) + " of " +
                          std::to_string(c.plan.input.numel()) + " values per sample");
    if (y.dtype != DType::i32 || y.shape.numel() != 1)
        throw usage_error("batch field '" + y.name + "' is " + std::string(dtype_name(y.dtype)) + " " + y.shape.str() +
                          " but the model takes one i32 class label per sample");
    if (!x.data || !y.data) throw runtime_error("batch without data");
    return {x.data, static_cast<const std::int32_t*>(y.data), b.size};
}

std::vector<std::uint8_t> pack_state(const StateView& s) {
    std::vector<std::uint8_t> out(state_magic.size() + 4 * 8 +
                                  4 * (s.params.size() + s.states.size() + s.slots.size()));
    std::uint8_t* p = out.data();
    std::memcpy(p, state_magic.data(), state_magic.size());
    p += state_magic.size();
    for (const std::uint64_t v :
         {std::uint64_t{s.params.size()}, std::uint64_t{s.states.size()}, std::uint64_t{s.slots.size()}, s.step}) {
        std::memcpy(p, &v, 8);
        p += 8;
    }
    for (const auto span : {s.params, s.states, s.slots}) {
        if (!span.empty()) std::memcpy(p, span.data(), span.size_bytes());
        p += span.size_bytes();
    }
    return out;
}

std::uint64_t unpack_state(std::span<const std::uint8_t> blob, std::span<float> params, std::span<float> states,
                           std::span<float> slots) {
    const std::size_t header = state_magic.size() + 4 * 8;
    if (blob.size() < header || std::memcmp(blob.data(), state_magic.data(), state_magic.size()) != 0)
        throw runtime_error("trainer state: not a dstrain state (bad magic)");
    std::uint64_t v[4];
    std::memcpy(v, blob.data() + state_magic.size(), sizeof v);
    if (v[0] != params.size() || v[1] != states.size() || v[2] != slots.size())
        throw runtime_error("trainer state holds " + std::to_string(v[0]) + " parameters, " + std::to_string(v[1]) +
                            " statistics and " + std::to_string(v[2]) + " optimiser values, but this model needs " +
                            std::to_string(params.size()) + ", " + std::to_string(states.size()) + " and " +
                            std::to_string(slots.size()) + " (different model or optimizer?)");
    if (blob.size() != header + 4 * (v[0] + v[1] + v[2]))
        throw runtime_error("trainer state: " + std::to_string(blob.size()) + " bytes (truncated?)");
    const std::uint8_t* p = blob.data() + header;
    for (const auto span : {params, states, slots}) {
        if (!span.empty()) std::memcpy(span.data(), p, span.size_bytes());
        p += span.size_bytes();
    }
    return v[3];
}

std::uint64_t dropout_stream(std::uint64_t layer, std::uint64_t step) {
    return (layer << 40) ^ step;
}

namespace {
class HostBuffer final : public BackendBuffer {
  public:
    explicit HostBuffer(std::uint64_t bytes) : data_(bytes) {}
    void* data() override { return data_.data(); }
    std::uint64_t bytes() const override { return data_.size(); }
    void upload(std::uint64_t offset, const void* src, std::uint64_t bytes) override {
        if (offset + bytes > data_.size()) throw runtime_error("BackendBuffer::upload past the end");
        std::memcpy(data_.data() + offset, src, bytes);
    }

  private:
    std::vector<std::uint8_t> data_;
};
} // namespace

std::unique_ptr<BackendBuffer> make_backend_buffer(const Device& device, std::uint64_t bytes) {
    if (device.backend == Backend::cpu) return std::make_unique<HostBuffer>(bytes);
#if defined(DSTK_HAVE_CUDA)
    return make_cuda_buffer(device.index, bytes);
#else
    throw no_fit_error("--device " + device_name(device) + " (built without CUDA support) use --device cpu");
#endif
}

std::vector<std::string> kernel_choice_lines(const std::vector<KernelReport>& reports, const NetworkPlan& plan) {
    std::vector<std::string> lines;
    std::size_t layer = ~std::size_t{0};
    for (const auto& r : reports) {
        if (r.layer != layer) {
            layer = r.layer;
            const LayerPlan& l = plan.layers.at(layer);
            lines.push_back("L" + std::to_string(layer) + " " + std::string(layer_kind_name(l.spec.kind)) + " " +
                            std::to_string(l.in.c) + "->" + std::to_string(l.out.c) + " at " + std::to_string(l.in.h) +
                            "x" + std::to_string(l.in.w) + ":");
        } else {
            lines.back() += ",";
        }
        char ms[32] = "";
        if (r.median_ms > 0.0) std::snprintf(ms, sizeof ms, " %.4f ms", r.median_ms);
        lines.back() += " " + r.op + " " + r.kernel + " (" + std::string(choice_source_name(r.source)) + ms + ")";
    }
    return lines;
}

std::unique_ptr<Trainer> make_trainer(const TrainerConfig& config) {
    validate_config(config);
    if (config.device.backend == Backend::cpu) return make_cpu_trainer(config);
#if defined(DSTK_HAVE_CUDA)
    return make_cuda_trainer(config);
#else
    throw no_fit_error("--device " + device_name(config.device) + " (built without CUDA support) use --device cpu");
#endif
}

} // namespace dstk::train
