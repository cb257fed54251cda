#include "dstk/train/trainer.hpp"

#include <algorithm>
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

// u8, i8 (widened like u8), bf16, f16, f32: what the input conversion reads.
bool is_input_dtype(DType t) {
    return t == DType::u8 || t == DType::i8 || t == DType::bf16 || t == DType::f16 || t == DType::f32;
}

void validate_config(const TrainerConfig& c) {
    if (c.max_batch == 0 || c.max_batch > (1u << 20))
        throw usage_error("invalid batch size " + std::to_string(c.max_batch) + " (must be 1 to 1048576)");
    if (!is_input_dtype(c.input_dtype))
        throw usage_error("input dtype " + std::string(dtype_name(c.input_dtype)) +
                          " is not supported for training (convert to u8, i8, bf16, f16 or f32 with dsconvert)");
    if (c.mean.size() != c.plan.input.c || c.std.size() != c.plan.input.c)
        throw usage_error("normalisation needs " + std::to_string(c.plan.input.c) + " per-channel means and stds");
    for (const float s : c.std)
        if (!(s > 0.0f)) throw usage_error("normalisation std must be positive (a constant channel?)");
    if (c.plan.heads.empty() || c.plan.heads.size() > max_step_heads)
        throw usage_error("model with " + std::to_string(c.plan.heads.size()) + " heads (1 to " +
                          std::to_string(max_step_heads) + ")");
    if (c.side.field.empty() != (c.plan.side == 0))
        throw usage_error(c.plan.side ? std::string("the model joins a side input: name its field")
                                      : "side input '" + c.side.field + "' for a model without one");
    if (c.plan.side) {
        const std::uint64_t channels = c.side.mean.size();
        if (channels == 0 || c.side.std.size() != channels || c.plan.side % channels != 0)
            throw usage_error("the side input's normalisation needs one mean and std per channel of its " +
                              std::to_string(c.plan.side) + " values");
        for (const float s : c.side.std)
            if (!(s > 0.0f)) throw usage_error("side input normalisation std must be positive (a constant value?)");
    }
    if (!(c.label_smoothing >= 0.0f && c.label_smoothing < 1.0f))
        throw usage_error("invalid --label-smoothing (must be in [0, 1))");
    if (!(c.optimizer.lr > 0.0f)) throw usage_error("invalid --lr (must be positive)");
    if (c.plan.params > (std::uint64_t{1} << 31)) throw usage_error("model has more than 2^31 parameters");
}

std::vector<BatchField> batch_fields(const TrainerConfig& c) {
    const TensorShape in = c.plan.input;
    std::vector<BatchField> out{{c.input_field, c.input_dtype, Shape{{in.c, in.h, in.w}}, nullptr}};
    for (const auto& h : c.plan.heads) {
        const bool seen =
            std::any_of(out.begin(), out.end(), [&](const BatchField& f) { return f.name == h.target.field; });
        if (!seen) out.push_back({h.target.field, h.target.dtype, h.target.shape, nullptr});
    }
    if (c.plan.side) out.push_back({c.side.field, c.side.dtype, Shape{{c.plan.side}}, nullptr});
    return out;
}

Batch step_batch(const TrainerConfig& c, std::span<const void* const> data, std::uint32_t size) {
    Batch b;
    b.size = size;
    b.fields = batch_fields(c);
    if (data.size() != b.fields.size())
        throw std::logic_error("step_batch: " + std::to_string(data.size()) + " buffers for " +
                               std::to_string(b.fields.size()) + " fields");
    for (std::size_t i = 0; i < data.size(); ++i) b.fields[i].data = data[i];
    return b;
}

Batch step_batch(const TrainerConfig& c, const void* x, const void* y, std::uint32_t size) {
    const void* data[] = {x, y};
    return step_batch(c, data, size);
}

namespace {

const BatchField& take_field(const Batch& b, const std::string& name, DType dtype, std::uint64_t numel,
                             const std::string& what) {
    const BatchField& f = b.field(name);
    if (f.dtype != dtype || f.shape.numel() != numel)
        throw usage_error("batch field '" + f.name + "' is " + std::string(dtype_name(f.dtype)) + " " + f.shape.str() +
                          " but the model takes " + std::string(dtype_name(dtype)) + " of " + std::to_string(numel) +
                          " values per sample (" + what + ")");
    if (!f.data) throw runtime_error("batch without data");
    return f;
}

} // namespace

StepFields step_fields(const TrainerConfig& c, const Batch& b) {
    if (b.size == 0 || b.size > c.max_batch)
        throw usage_error("batch of " + std::to_string(b.size) + " samples (the trainer was planned for 1 to " +
                          std::to_string(c.max_batch) + ")");
    StepFields f;
    f.size = b.size;
    const BatchField& x = take_field(b, c.input_field, c.input_dtype, c.plan.input.numel(), "its input");
    f.x = {x.data, x.rows};
    for (std::size_t h = 0; h < c.plan.heads.size(); ++h) {
        const Target& t = c.plan.heads[h].target;
        const BatchField& y = take_field(b, t.field, t.dtype, t.shape.numel(), "a target");
        f.targets[h] = {y.data, y.rows};
    }
    if (c.plan.side) {
        const BatchField& side = take_field(b, c.side.field, c.side.dtype, c.plan.side, "its side input");
        f.side = {side.data, side.rows};
    }
    return f;
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
        if (r.layer != layer && r.layer >= plan.layers.size()) { // a choice for the whole step
            layer = r.layer;
            lines.push_back("step:");
        } else if (r.layer != layer) {
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
