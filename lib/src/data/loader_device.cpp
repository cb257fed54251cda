// The cuda backend of the converted-batch engine (loader.hpp): the device
// slots, the feeder thread that converts batches ahead, and the consumer's
// hand-off.
#include <chrono>
#include <string>
#include <system_error>
#include <utility>

#include "dstk/data/interrupt.hpp"
#include "dstk/data/loader.hpp"
#include "dstk/error.hpp"
#include "loader_slots.hpp"

namespace dstk::data {

LoaderSlots::LoaderSlots(unsigned count) : count_(count) {
    for (unsigned k = 0; k < count_; ++k) slots_.push_back(Slot{{}, gpu::Event(false), gpu::Event(false)});
}

LoaderSlots::~LoaderSlots() {
    stream_.synchronize(); // no conversion may still write into memory being freed
}

void LoaderSlots::allocate(std::uint32_t batch, const std::vector<FieldOutput>& outputs,
                           const std::vector<std::vector<float>>& inv_std) {
    for (Slot& s : slots_)
        for (const FieldOutput& o : outputs) {
            s.fields.emplace_back(gpu::Memory::device, std::uint64_t{batch} * o.sample_bytes());
            bytes_ += s.fields.back().bytes();
        }
    for (std::size_t f = 0; f < outputs.size(); ++f) {
        stats_.emplace_back();
        const std::vector<float>& mean = outputs[f].norm.mean;
        if (mean.empty()) continue;
        stats_.back().mean = gpu::Buffer(gpu::Memory::device, mean.size() * 4);
        stats_.back().inv_std = gpu::Buffer(gpu::Memory::device, mean.size() * 4);
        gpu::copy_h2d(stats_.back().mean.get(), mean.data(), mean.size() * 4);
        gpu::copy_h2d(stats_.back().inv_std.get(), inv_std[f].data(), mean.size() * 4);
        bytes_ += 2 * mean.size() * 4;
    }
}

std::vector<void*> LoaderSlots::fields(unsigned slot) const {
    std::vector<void*> out;
    for (const gpu::Buffer& b : slots_[slot].fields) out.push_back(b.get());
    return out;
}

std::shared_ptr<LoaderSlots> make_device_slots(const Device& device, unsigned count) {
    gpu::set_device(device.index);
    return std::make_shared<LoaderSlots>(count);
}

void Loader::start_feeder() {
    {
        std::lock_guard lock(mutex_);
        stop_ = epoch_done_ = false;
        error_ = nullptr;
        prepared_ = taken_;
    }
    try {
        feeder_ = std::thread([this] { feed_loop(); });
    } catch (const std::system_error& e) {
        throw runtime_error(std::string("cannot start the loader's feeder thread (") + e.what() +
                            "); the system refuses more threads (a pids or thread limit): end other processes");
    }
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
    // The source's waits for its readers end when the feeder is stopped: a
    // read that never returns must not hold stop_feeder (start_epoch, the
    // destructor) with it.
    const InterruptCheck stopping([this] {
        std::lock_guard lock(mutex_);
        return stop_;
    });
    try {
        gpu::set_device(plan_.config.device.index); // per thread
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
    } catch (const Interrupted&) {
        return; // stopped while the source waited: stop_feeder ends the epoch
    } catch (...) {
        {
            std::lock_guard lock(mutex_);
            error_ = std::current_exception();
            epoch_done_ = true;
        }
        changed_.notify_all();
    }
}

// Converts the source's next batch into turn's slot, every field in one
// launch; its samples, 0 at the end of the epoch.
std::uint32_t Loader::feed_one(std::uint64_t turn) {
    std::lock_guard lock(source_mutex_);
    const Batch* batch = source_->next();
    if (!batch) return 0;
    LoaderSlots& s = *slots_;
    const auto k = static_cast<unsigned>(turn % s.count());
    // The slot's last batch (turn - slots) lives until turn - ahead (its
    // successor keep + 1 turns on) is taken: the work the consumer enqueued
    // before that take must be done.
    if (turn >= s.count()) gpu::wait(s.stream(), s.consumed((turn - ahead) % s.count()));
    const std::vector<void*> out = s.fields(k);
    convert_fields_async(conversions(*batch, out, true), batch->size, s.stream());
    s.ready(k).record(s.stream());
    source_->release();
    return batch->size;
}

bool Loader::next_device(DeviceBatch& out) {
    std::unique_lock lock(mutex_);
    const auto t0 = std::chrono::steady_clock::now();
    wait_interruptible(changed_, lock, [&] { return prepared_ > taken_ || epoch_done_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (prepared_ == taken_) {
        if (error_) std::rethrow_exception(error_);
        return false;
    }
    const auto k = static_cast<unsigned>(taken_ % sizes_.size());
    // Work the consumer enqueued before taking this batch: the feeder waits
    // for it before it converts turn taken_ + ahead (see feed_one).
    slots_->consumed(k).record(reinterpret_cast<void*>(consumer_));
    out = slot_batch(k, sizes_[k]);
    ++taken_;
    lock.unlock();
    changed_.notify_all();
    return true;
}

void Loader::wait_ready(unsigned slot, std::uintptr_t stream) {
    if (slot == waited_slot_ && stream == consumer_ && taken_ == waited_taken_) return;
    consumer_ = stream;
    gpu::wait(reinterpret_cast<void*>(stream), slots_->ready(slot));
    waited_slot_ = slot;
    waited_taken_ = taken_;
}

DeviceBatch Loader::slot_batch(unsigned slot, std::uint32_t size) const {
    if (!slots_) throw usage_error("no GPU batches: this loader delivers batches in host memory");
    if (slot >= slots_->count() || size > plan_.config.batch)
        throw usage_error("no batch of " + std::to_string(size) + " samples in slot " + std::to_string(slot));
    return {slots_->fields(slot), size, slot, slots_};
}

} // namespace dstk::data
