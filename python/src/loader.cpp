#include "loader.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "dstk/error.hpp"
#include "dstk/train/model.hpp"
#if defined(DSTK_HAVE_CUDA)
#include "dstk/data/gpu_ops.hpp"
#endif

namespace dstk::py {

#if defined(DSTK_HAVE_CUDA)

// keep + 1 batch slots in device memory, the loader's stream, and per slot an
// event "converted" (ready) and an event on the consumer's stream "work
// enqueued before this batch was taken" (consumed).
class DeviceSlots {
  public:
    DeviceSlots(unsigned count, std::uint64_t x_bytes, std::uint32_t batch, const std::vector<float>& mean,
                const std::vector<float>& inv_std) {
        stream = own(data::gpu::stream_create(), data::gpu::stream_destroy);
        for (unsigned k = 0; k < count; ++k) {
            x.push_back(own(data::gpu::device_alloc(x_bytes), data::gpu::device_free));
            y.push_back(own(data::gpu::device_alloc(std::uint64_t{batch} * 4), data::gpu::device_free));
            ready.push_back(own(data::gpu::event_create(false), data::gpu::event_destroy));
            consumed.push_back(own(data::gpu::event_create(false), data::gpu::event_destroy));
        }
        bytes = count * (x_bytes + std::uint64_t{batch} * 4) + mean.size() * 8;
        if (mean.empty()) return;
        this->mean = static_cast<float*>(own(data::gpu::device_alloc(mean.size() * 4), data::gpu::device_free));
        this->inv_std = static_cast<float*>(own(data::gpu::device_alloc(mean.size() * 4), data::gpu::device_free));
        data::gpu::copy_h2d(this->mean, mean.data(), mean.size() * 4);
        data::gpu::copy_h2d(this->inv_std, inv_std.data(), inv_std.size() * 4);
    }
    ~DeviceSlots() {
        if (stream) data::gpu::stream_synchronize(stream);
        for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) it->second(it->first);
    }
    DeviceSlots(const DeviceSlots&) = delete;
    DeviceSlots& operator=(const DeviceSlots&) = delete;

    void* stream = nullptr;
    std::vector<void*> x, y, ready, consumed;
    float* mean = nullptr;
    float* inv_std = nullptr;
    std::uint64_t bytes = 0;

  private:
    void* own(void* p, void (*free)(void*)) {
        owned_.emplace_back(p, free);
        return p;
    }
    std::vector<std::pair<void*, void (*)(void*)>> owned_;
};

#else

class DeviceSlots {};

#endif

Loader::Loader(const std::filesystem::path& dir, const LoaderConfig& config)
    : config_(config), dataset_(Dataset::open(dir)) {
    const Manifest& m = dataset_.manifest();
    x_ = &m.split(config_.split).field(m.input_field);
    const train::TensorShape in = train::tensor_shape_from(x_->shape);
    channels_ = in.c;
    hw_ = std::uint64_t{in.h} * in.w;
    if (config_.convert) {
        const DType t = x_->dtype;
        if (t != DType::u8 && t != DType::bf16 && t != DType::f16 && t != DType::f32)
            throw usage_error("field '" + x_->name + "' is " + std::string(dtype_name(t)) +
                              " (the loader converts u8, bf16, f16 and f32 to float); pass convert=False for the "
                              "stored values, or convert the dataset with dsconvert --dtype");
        resolve_stats(dataset_);
    }
    if (config_.keep == 0) throw usage_error("invalid keep=0 (a consumer holds at least the batch it was given)");
#if defined(DSTK_HAVE_CUDA)
    if (on_gpu()) {
        data::gpu::set_device(config_.source.device.index);
        slots_ =
            std::make_shared<DeviceSlots>(config_.keep + 1, std::uint64_t{config_.source.batch} * out_sample_bytes(),
                                          config_.source.batch, mean_, inv_std_);
        config_.source.compute_stream = slots_->stream;
    }
#endif
    source_ = data::make_batch_source(dataset_, config_.split, config_.source);
}

Loader::~Loader() {
    source_.reset(); // its slots are freed once our stream is done with them
}

void Loader::resolve_stats(const Dataset& ds) {
    if (!config_.normalize) {
        mean_.assign(channels_, 0.0f);
        std_.assign(channels_, 1.0f);
        inv_std_.assign(channels_, 1.0f);
        return;
    }
    if (config_.mean.empty() != config_.std.empty())
        throw usage_error("mean and std are given together (one without the other cannot normalise)");
    if (!config_.mean.empty()) {
        if (config_.mean.size() != channels_ || config_.std.size() != channels_)
            throw usage_error("mean and std have " + std::to_string(config_.mean.size()) + " and " +
                              std::to_string(config_.std.size()) + " values but '" + x_->name + "' (" +
                              x_->shape.str() + ") has " + std::to_string(channels_) +
                              " channels; give one per channel");
        mean_ = config_.mean;
        std_ = config_.std;
    } else {
        const auto& stats = ds.manifest().stats;
        if (!stats || stats->mean.size() != channels_ || stats->std.size() != channels_)
            throw usage_error(ds.dir().string() + "/dataset.json has no per-channel mean and std for " +
                              std::to_string(channels_) +
                              " channels (the loader normalises with them); pass mean= "
                              "and std=, or normalize=False");
        for (std::uint32_t c = 0; c < channels_; ++c) {
            mean_.push_back(static_cast<float>(stats->mean[c]));
            std_.push_back(static_cast<float>(std::max(stats->std[c], 1e-6)));
        }
    }
    for (const float s : std_) {
        if (!(s > 0)) throw usage_error("std values must be positive (they divide)");
        inv_std_.push_back(1.0f / s);
    }
}

void Loader::start_epoch(std::uint64_t epoch, std::uint64_t first_batch) {
    source_->start_epoch(epoch, first_batch);
}

// The trainer's conversion on the host: x' = (x - mean[c]) / std[c], CHW.
void Loader::convert_host(const train::Batch& b, void* x, std::int32_t* y) const {
    std::memcpy(y, b.y, std::uint64_t{b.size} * 4);
    const std::uint64_t per = x_->shape.numel(), total = per * b.size;
    if (!config_.convert) {
        std::memcpy(x, b.x, b.size * x_->sample_bytes());
        return;
    }
    auto* out = static_cast<float*>(x);
    auto value = [&](std::uint64_t i) -> float {
        switch (x_->dtype) {
        case DType::u8:
            return static_cast<const std::uint8_t*>(b.x)[i];
        case DType::bf16:
            return bf16_to_float(static_cast<const std::uint16_t*>(b.x)[i]);
        case DType::f16:
            return f16_to_float(static_cast<const std::uint16_t*>(b.x)[i]);
        default:
            return static_cast<const float*>(b.x)[i];
        }
    };
    for (std::uint64_t i = 0; i < total; ++i) {
        const std::uint64_t c = (i % per) / hw_;
        out[i] = (value(i) - mean_[c]) * inv_std_[c];
    }
}

std::uint32_t Loader::next_host(void* x, std::int32_t* y) {
    train::Batch b;
    if (!source_->next(b)) return 0;
    try {
        convert_host(b, x, y);
    } catch (...) {
        source_->release();
        throw;
    }
    source_->release();
    return b.size;
}

#if defined(DSTK_HAVE_CUDA)

bool Loader::next_device(DeviceBatch& out) {
    train::Batch b;
    if (!source_->next(b)) return false;
    DeviceSlots& s = *slots_;
    const auto k = static_cast<unsigned>(taken_ % s.x.size());
    const auto before = static_cast<unsigned>((taken_ + s.x.size() - 1) % s.x.size());
    // Work the consumer enqueued before taking this batch; the slot is reused
    // once the work enqueued before the previous one is done.
    data::gpu::event_record(s.consumed[k], reinterpret_cast<void*>(consumer_));
    if (taken_ > 0) data::gpu::stream_wait_event(s.stream, s.consumed[before]);
    if (config_.convert)
        data::gpu::convert_batch_async(b.x, x_->dtype, b.y, b.size, channels_, hw_, s.mean, s.inv_std,
                                       static_cast<float*>(s.x[k]), static_cast<std::int32_t*>(s.y[k]), s.stream);
    else {
        data::gpu::copy_d2d_async(s.x[k], b.x, b.size * x_->sample_bytes(), s.stream);
        data::gpu::copy_d2d_async(s.y[k], b.y, std::uint64_t{b.size} * 4, s.stream);
    }
    data::gpu::event_record(s.ready[k], s.stream);
    source_->release();
    ++taken_;
    out = {s.x[k], static_cast<std::int32_t*>(s.y[k]), b.size, k, slots_};
    return true;
}

void Loader::wait_ready(unsigned slot, std::uintptr_t stream) {
    if (slot == waited_slot_ && stream == consumer_ && taken_ == waited_taken_) return;
    consumer_ = stream;
    data::gpu::stream_wait_event(reinterpret_cast<void*>(stream), slots_->ready.at(slot));
    waited_slot_ = slot;
    waited_taken_ = taken_;
}

std::uint64_t Loader::device_bytes() const {
    return source_->device_bytes() + (slots_ ? slots_->bytes : 0);
}

#else

bool Loader::next_device(DeviceBatch&) {
    throw no_fit_error("dstk was built without CUDA support (no GPU batches); use placement='host' or device='cpu'");
}
void Loader::wait_ready(unsigned, std::uintptr_t) {
    throw no_fit_error("dstk was built without CUDA support (no GPU batches); use placement='host' or device='cpu'");
}
std::uint64_t Loader::device_bytes() const {
    return source_->device_bytes();
}

#endif

} // namespace dstk::py
