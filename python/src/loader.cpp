#include "loader.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "dstk/error.hpp"
#include "dstk/train/model.hpp"
#if defined(DSTK_HAVE_CUDA)
#include "dstk/data/gpu_ops.hpp"
#endif

namespace dstk::py {

#if defined(DSTK_HAVE_CUDA)

// keep + 1 + ahead batch slots in device memory, the loader's stream, and per slot an
// event "converted" (ready) and an event on the consumer's stream "work
// enqueued before this batch was taken" (consumed).
class DeviceSlots {
  public:
    DeviceSlots(unsigned count, std::uint64_t x_bytes, std::uint64_t y_bytes, const std::vector<float>& mean,
                const std::vector<float>& inv_std) {
        stream = own(data::gpu::stream_create(), data::gpu::stream_destroy);
        for (unsigned k = 0; k < count; ++k) {
            x.push_back(own(data::gpu::device_alloc(x_bytes), data::gpu::device_free));
            y.push_back(own(data::gpu::device_alloc(y_bytes), data::gpu::device_free));
            ready.push_back(own(data::gpu::event_create(false), data::gpu::event_destroy));
            consumed.push_back(own(data::gpu::event_create(false), data::gpu::event_destroy));
        }
        bytes = count * (x_bytes + y_bytes) + mean.size() * 8;
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
        const std::uint64_t batch = config_.source.batch;
        const unsigned slots = config_.keep + 1 + ahead;
        slots_ =
            std::make_shared<DeviceSlots>(slots, batch * out_sample_bytes(), batch * label_bytes(), mean_, inv_std_);
        sizes_.assign(slots, 0);
        config_.source.compute_stream = slots_->stream;
    }
#endif
    source_ = data::make_batch_source(dataset_, config_.split, config_.source);
    epoch_done_ = true; // the feeder starts with the first start_epoch, as the source's readers do
}

Loader::~Loader() {
    stop_feeder();
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
    if (!on_gpu()) return source_->start_epoch(epoch, first_batch);
    stop_feeder(); // batches it converted ahead for the abandoned iteration are dropped
    {
        std::lock_guard lock(source_mutex_);
        source_->start_epoch(epoch, first_batch);
    }
    wait_seconds_ = 0;
    start_feeder();
}

data::StageTimes Loader::take_times() {
    if (!on_gpu()) return source_->take_times();
    data::StageTimes t;
    {
        std::lock_guard lock(source_mutex_);
        t = source_->take_times();
    }
    std::lock_guard lock(mutex_);
    t.read_wait = std::exchange(wait_seconds_, 0.0);
    return t;
}

void Loader::start_feeder() {
    {
        std::lock_guard lock(mutex_);
        stop_ = epoch_done_ = false;
        error_ = nullptr;
        prepared_ = taken_;
    }
    feeder_ = std::thread([this] { feed_loop(); });
}

void Loader::stop_feeder() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    changed_.notify_all();
    if (feeder_.joinable()) feeder_.join();
    std::lock_guard lock(mutex_);
    epoch_done_ = true; // nothing more comes until start_feeder
}

// Converts batches while fewer than `ahead` wait to be taken; with keep + 1 +
// ahead slots, the batch a turn overwrites is one the consumer no longer holds
// (it holds the newest and keep before it).
void Loader::feed_loop() {
    try {
#if defined(DSTK_HAVE_CUDA)
        data::gpu::set_device(config_.source.device.index); // per thread
#endif
        for (;;) {
            std::uint64_t turn;
            {
                std::unique_lock lock(mutex_);
                changed_.wait(lock, [&] { return stop_ || prepared_ < taken_ + ahead; });
                if (stop_) return;
                turn = prepared_;
            }
            const std::uint32_t size = feed_one(turn);
            {
                std::lock_guard lock(mutex_);
                if (size != 0) {
                    sizes_[turn % sizes_.size()] = size;
                    ++prepared_;
                } else
                    epoch_done_ = true;
            }
            changed_.notify_all();
            if (size == 0) return;
        }
    } catch (...) {
        {
            std::lock_guard lock(mutex_);
            error_ = std::current_exception();
            epoch_done_ = true;
        }
        changed_.notify_all();
    }
}

// A source batch holds the input field, then the label field (make_batch_source).
Loader::XY Loader::xy(const Batch& b) const {
    return {b.fields[0].data, static_cast<const std::int32_t*>(b.fields[1].data), b.size};
}

// The trainer's conversion on the host: x' = (x - mean[c]) / std[c], CHW.
void Loader::convert_host(const XY& b, void* x, void* y) const {
    if (config_.labels64)
        std::copy(b.y, b.y + b.size, static_cast<std::int64_t*>(y));
    else
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

std::uint32_t Loader::next_host(void* x, void* y) {
    const Batch* batch = source_->next();
    if (!batch) return 0;
    const XY b = xy(*batch);
    try {
        convert_host(b, x, y);
    } catch (...) {
        source_->release();
        throw;
    }
    source_->release();
    return b.size;
}

bool Loader::next_device(DeviceBatch& out) {
    std::unique_lock lock(mutex_);
    const auto t0 = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return prepared_ > taken_ || epoch_done_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (prepared_ == taken_) {
        if (error_) std::rethrow_exception(error_);
        return false;
    }
    const auto k = static_cast<unsigned>(taken_ % sizes_.size());
#if defined(DSTK_HAVE_CUDA)
    // Work the consumer enqueued before taking this batch: the feeder waits
    // for it before it converts turn taken_ + ahead (see feed_one).
    data::gpu::event_record(slots_->consumed[k], reinterpret_cast<void*>(consumer_));
#endif
    out = slot_batch(k, sizes_[k]);
    ++taken_;
    lock.unlock();
    changed_.notify_all();
    return true;
}

#if defined(DSTK_HAVE_CUDA)

std::uint32_t Loader::feed_one(std::uint64_t turn) {
    std::lock_guard lock(source_mutex_);
    const Batch* batch = source_->next();
    if (!batch) return 0;
    const XY b = xy(*batch);
    DeviceSlots& s = *slots_;
    const auto k = static_cast<unsigned>(turn % s.x.size());
    // The slot's last batch (turn - slots) lives until turn - ahead (its
    // successor keep + 1 turns on) is taken: the work the consumer enqueued
    // before that take must be done.
    if (turn >= s.x.size()) data::gpu::stream_wait_event(s.stream, s.consumed[(turn - ahead) % s.x.size()]);
    auto* y32 = config_.labels64 ? nullptr : static_cast<std::int32_t*>(s.y[k]);
    if (config_.convert)
        data::gpu::convert_batch_async(b.x, x_->dtype, b.y, b.size, channels_, hw_, s.mean, s.inv_std,
                                       static_cast<float*>(s.x[k]), y32, s.stream);
    else
        data::gpu::copy_d2d_async(s.x[k], b.x, b.size * x_->sample_bytes(), s.stream);
    if (config_.labels64)
        data::gpu::widen_labels_async(b.y, static_cast<std::int64_t*>(s.y[k]), b.size, s.stream);
    else if (!config_.convert)
        data::gpu::copy_d2d_async(s.y[k], b.y, std::uint64_t{b.size} * 4, s.stream);
    data::gpu::event_record(s.ready[k], s.stream);
    source_->release();
    return b.size;
}

void Loader::wait_ready(unsigned slot, std::uintptr_t stream) {
    if (slot == waited_slot_ && stream == consumer_ && taken_ == waited_taken_) return;
    consumer_ = stream;
    data::gpu::stream_wait_event(reinterpret_cast<void*>(stream), slots_->ready.at(slot));
    waited_slot_ = slot;
    waited_taken_ = taken_;
}

DeviceBatch Loader::slot_batch(unsigned slot, std::uint32_t size) const {
    if (slot >= slots_->x.size() || size > config_.source.batch)
        throw usage_error("no batch of " + std::to_string(size) + " samples in slot " + std::to_string(slot));
    return {slots_->x[slot], slots_->y[slot], size, slot, slots_};
}

std::uint64_t Loader::device_bytes() const {
    return source_->device_bytes() + (slots_ ? slots_->bytes : 0);
}

#else

namespace {
[[noreturn]] void no_cuda() {
    throw no_fit_error("dstk was built without CUDA support (no GPU batches); use placement='host' or device='cpu'");
}
} // namespace

std::uint32_t Loader::feed_one(std::uint64_t) {
    no_cuda();
}
DeviceBatch Loader::slot_batch(unsigned, std::uint32_t) const {
    no_cuda();
}
void Loader::wait_ready(unsigned, std::uintptr_t) {
    no_cuda();
}
std::uint64_t Loader::device_bytes() const {
    return source_->device_bytes();
}

#endif

} // namespace dstk::py
