// The mix's batch source (mix_source.hpp): member batches staged in rings of
// 2B rows per field, the mix's batch gathered from them, on either backend.
#include "dstk/data/mix_source.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "clock.hpp"
#include "dstk/data/gpu_ops.hpp"
#include "dstk/gpu_runtime.hpp"
#include "source_parts.hpp"

namespace dstk::data {
namespace {

// Each row of a mix batch: where it is in the staging (member m's ring starts
// at row m * 2B), its member and its row in the member's split.
struct RowTable {
    std::uint64_t* staging_row = nullptr;
    std::int32_t* dataset = nullptr;
    std::int64_t* index = nullptr;
};

// Where the staging and the batch live, and how rows move there: host memory
// and memcpy (cpu), or device memory, copies and the gather kernel on the
// compute stream (cuda).
class Backing {
  public:
    virtual ~Backing() = default;
    virtual void* allocate(std::uint64_t bytes) = 0;
    // The next batch's table (cuda: pinned, reused once its upload is done).
    virtual RowTable table() = 0;
    virtual void copy(void* dst, const void* src, std::uint64_t bytes) = 0;
    // The table's rows are written: upload them (cuda).
    virtual void upload(std::uint32_t rows) = 0;
    virtual void gather(void* dst, const void* staging, std::uint64_t row_bytes, std::uint32_t rows) = 0;
    // dataset / index: from the table into the batch.
    virtual void put(void* dst, const void* table_part, std::uint64_t bytes) = 0;
};

class HostBacking final : public Backing {
  public:
    explicit HostBacking(std::uint32_t batch) : rows_(batch), dataset_(batch), index_(batch) {}
    void* allocate(std::uint64_t bytes) override { return memory_.emplace_back(bytes).data(); }
    RowTable table() override { return {rows_.data(), dataset_.data(), index_.data()}; }
    void copy(void* dst, const void* src, std::uint64_t bytes) override { std::memcpy(dst, src, bytes); }
    void upload(std::uint32_t) override {}
    void gather(void* dst, const void* staging, std::uint64_t row_bytes, std::uint32_t rows) override {
        auto* d = static_cast<std::uint8_t*>(dst);
        const auto* s = static_cast<const std::uint8_t*>(staging);
        for (std::uint32_t i = 0; i < rows; ++i) std::memcpy(d + i * row_bytes, s + rows_[i] * row_bytes, row_bytes);
    }
    void put(void* dst, const void* part, std::uint64_t bytes) override { std::memcpy(dst, part, bytes); }

  private:
    std::vector<std::vector<std::uint8_t>> memory_;
    std::vector<std::uint64_t> rows_;
    std::vector<std::int32_t> dataset_;
    std::vector<std::int64_t> index_;
};

// Two pinned tables in turn, each reused once the upload that read it is
// done; the gather reads the rows from device memory.
class DeviceBacking final : public Backing {
  public:
    DeviceBacking(std::uint32_t batch, void* stream) : batch_(batch), stream_(stream) {
        for (Table& t : tables_) t.host = gpu::Buffer(gpu::Memory::pinned, table_bytes());
        rows_ = gpu::Buffer(gpu::Memory::device, std::uint64_t{batch} * sizeof(std::uint64_t));
    }
    void* allocate(std::uint64_t bytes) override {
        return memory_.emplace_back(gpu::Memory::device, std::max<std::uint64_t>(bytes, 1)).get();
    }
    RowTable table() override {
        current_ = 1 - current_;
        Table& t = tables_[current_];
        if (t.used) t.uploaded.synchronize();
        auto* p = t.host.as<std::uint8_t>();
        return {reinterpret_cast<std::uint64_t*>(p), reinterpret_cast<std::int32_t*>(p + 16 * std::uint64_t{batch_}),
                reinterpret_cast<std::int64_t*>(p + 8 * std::uint64_t{batch_})};
    }
    void copy(void* dst, const void* src, std::uint64_t bytes) override {
        gpu::copy_d2d_async(dst, src, bytes, stream_);
    }
    void upload(std::uint32_t rows) override {
        gpu::copy_h2d_async(rows_.get(), tables_[current_].host.get(), std::uint64_t{rows} * 8, stream_);
        uploaded();
    }
    void gather(void* dst, const void* staging, std::uint64_t row_bytes, std::uint32_t rows) override {
        kernels::gather_rows_async(dst, staging, row_bytes, rows_.as<std::uint64_t>(), rows, stream_);
    }
    void put(void* dst, const void* part, std::uint64_t bytes) override {
        gpu::copy_h2d_async(dst, part, bytes, stream_);
        uploaded();
    }

  private:
    struct Table {
        gpu::Buffer host;
        gpu::Event uploaded;
        bool used = false;
    };
    std::uint64_t table_bytes() const { return std::uint64_t{batch_} * (8 + 8 + 4); }
    // The table is read by copies enqueued so far: reused after them.
    void uploaded() {
        Table& t = tables_[current_];
        t.uploaded.record(stream_);
        t.used = true;
    }

    std::uint32_t batch_;
    void* stream_;
    std::array<Table, 2> tables_;
    int current_ = 0;
    gpu::Buffer rows_;
    std::vector<gpu::Buffer> memory_;
};

// One member: its source, its order (for the index field) and its staging
// ring: local positions [lo, hi) are held, position q at ring row q % 2B.
struct Member {
    std::unique_ptr<BatchSource> source;
    OrderConfig order;
    std::uint64_t samples = 0;
    std::unique_ptr<EpochOrder> epoch_order;
    std::uint64_t lo = 0, hi = 0;
    std::uint64_t delivered = 0;
};

class MixBatchSource final : public MixSource {
  public:
    MixBatchSource(const std::vector<const Dataset*>& datasets, const MixPlan& plan);

    Placement placement() const override { return placement_; }
    std::uint64_t samples() const override { return plan_.positions; }
    std::uint64_t batches_per_epoch() const override { return batches_; }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override {
        resume_epoch(MixOrder(plan_.seed, epoch, plan_.order_members()), epoch, first_batch);
    }
    void resume_epoch(MixOrder order, std::uint64_t epoch, std::uint64_t first_batch) override;
    const MixOrder& order() const override;
    std::vector<std::uint64_t> delivered() const override;
    const Batch* next() override;
    void release() override {}
    void stop() override {
        for (Member& m : members_) m.source->stop();
    }
    StageTimes take_times() override;
    std::uint64_t device_bytes() const override;
    std::uint64_t host_bytes() const override;
    std::uint64_t host_resident() const override;

  private:
    void fill(Member& m, std::size_t index, std::uint64_t first, std::uint64_t end);
    void stage(std::size_t index, const Batch& b, std::uint64_t start, std::uint64_t from);

    MixPlan plan_;
    std::unique_ptr<Backing> backing_;
    std::vector<Member> members_;
    std::vector<std::size_t> stored_; // per batch field: its index in the members' batches (npos: added)
    std::vector<std::uint64_t> field_bytes_;
    std::vector<void*> staging_, slot_; // per stored field; per batch field
    std::uint64_t ring_rows_;
    bool wants_index_ = false; // the index field is delivered: each draw's row in its member
    Placement placement_ = Placement::device;
    std::unique_ptr<MixOrder> order_;
    std::uint64_t next_ = 0, total_ = 0, batches_ = 0;
    Batch batch_;
    StageTimes times_;
    BatchHash hash_;
};

MixBatchSource::MixBatchSource(const std::vector<const Dataset*>& datasets, const MixPlan& plan)
    : plan_(plan), ring_rows_(2 * std::uint64_t{plan.batch}), batches_(plan.batches) {
    const SourceConfig& c0 = plan.members.at(0).source.config;
    const bool cuda = c0.device.backend == Backend::cuda;
    if (cuda)
        backing_ = std::make_unique<DeviceBacking>(plan.batch, c0.compute_stream);
    else
        backing_ = std::make_unique<HostBacking>(plan.batch);
    hash_.on = plan.hash_batches && !cuda;
    for (std::size_t i = 0; i < plan.members.size(); ++i) {
        SourcePlan sp = plan.members[i].source;
        sp.config.hash_batches = false;
        Member m;
        m.source = make_batch_source(*datasets.at(i), sp);
        m.order = sp.config.order;
        m.samples = sp.samples;
        if (sp.config.placement != Placement::device) placement_ = Placement::stream;
        members_.push_back(std::move(m));
    }
    const std::vector<BatchField>& stored = plan.members[0].source.fields;
    for (const BatchField& f : stored)
        staging_.push_back(backing_->allocate(plan.members.size() * ring_rows_ * f.sample_bytes()));
    for (const BatchField& f : plan.fields) {
        std::size_t at = std::string::npos;
        for (std::size_t s = 0; s < stored.size(); ++s)
            if (stored[s].name == f.name) at = s;
        stored_.push_back(at);
        field_bytes_.push_back(f.sample_bytes());
        slot_.push_back(backing_->allocate(std::uint64_t{plan.batch} * f.sample_bytes()));
        wants_index_ = wants_index_ || f.name == index_field;
        batch_.fields.push_back(f);
    }
}

void MixBatchSource::resume_epoch(MixOrder order, std::uint64_t epoch, std::uint64_t first_batch) {
    if (order.keys().size() != members_.size())
        throw std::logic_error("MixSource: an order of " + std::to_string(order.keys().size()) + " members for " +
                               std::to_string(members_.size()));
    // No epoch until every member has started (a start interrupted while a
    // member waits for its readers leaves none: next() says so).
    order_.reset();
    auto o = std::make_unique<MixOrder>(std::move(order));
    next_ = first_batch;
    total_ = o->size();
    batches_ = plan_.slice.batches(total_, plan_.batch, plan_.drop_last);
    const std::uint64_t first = plan_.slice.first_position(first_batch, plan_.batch);
    const std::vector<std::uint64_t> taken = o->taken(std::min(first, total_));
    const std::vector<std::uint64_t> draws = o->taken(total_);
    const std::uint64_t b = plan_.batch;
    for (std::size_t i = 0; i < members_.size(); ++i) {
        Member& m = members_[i];
        // The member's epoch ends at its last draw; its next epoch is read
        // ahead, so that the next mix epoch does not wait for its first window.
        m.source->chain_epochs((draws[i] + b - 1) / b);
        m.source->start_epoch(epoch, taken[i] / b);
        m.lo = m.hi = taken[i] / b * b;
        m.delivered = 0;
        m.epoch_order = std::make_unique<EpochOrder>(m.order, m.samples, epoch);
    }
    order_ = std::move(o);
    times_ = {};
    StageTimes dropped;
    hash_.take(dropped);
}

const MixOrder& MixBatchSource::order() const {
    if (!order_) throw std::logic_error("MixSource::order before start_epoch");
    return *order_;
}

std::vector<std::uint64_t> MixBatchSource::delivered() const {
    std::vector<std::uint64_t> out;
    for (const Member& m : members_) out.push_back(m.delivered);
    return out;
}

// Member `index`'s staging holds its local positions [first, end): its
// batches are read (those wholly before `first` skipped) until they reach end.
void MixBatchSource::fill(Member& m, std::size_t index, std::uint64_t first, std::uint64_t end) {
    while (m.hi < end) {
        const auto t0 = Clock::now();
        const Batch* b = m.source->next();
        times_.read_wait += seconds_since(t0);
        if (!b)
            throw std::logic_error("MixSource: member " + plan_.members[index].dataset.string() + " ended at " +
                                   std::to_string(m.hi) + " of " + std::to_string(end) + " draws");
        if (m.hi + b->size > first) stage(index, *b, m.hi, std::max(first, m.hi));
        m.hi += b->size;
        m.source->release();
    }
    m.lo = first;
    if (m.hi - m.lo > ring_rows_) throw std::logic_error("MixSource: a batch's draws overflow the staging");
}

// Rows [from, start + b.size) of member batch b (which begins at local
// position `start`) into the member's ring, in at most two pieces.
void MixBatchSource::stage(std::size_t index, const Batch& b, std::uint64_t start, std::uint64_t from) {
    const std::uint64_t end = start + b.size;
    for (std::size_t s = 0; s < staging_.size(); ++s) {
        const std::uint64_t sb = b.fields[s].sample_bytes();
        auto* ring = static_cast<std::uint8_t*>(staging_[s]) + index * ring_rows_ * sb;
        const auto* src = static_cast<const std::uint8_t*>(b.fields[s].data);
        for (std::uint64_t q = from; q < end;) {
            const std::uint64_t at = q % ring_rows_, n = std::min(end - q, ring_rows_ - at);
            backing_->copy(ring + at * sb, src + (q - start) * sb, n * sb);
            q += n;
        }
    }
}

const Batch* MixBatchSource::next() {
    if (!order_) throw std::logic_error("MixSource::next before start_epoch");
    if (next_ >= batches_) return nullptr;
    const std::uint64_t first = plan_.slice.first_position(next_, plan_.batch);
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(plan_.batch, total_ - first));
    std::vector<MixDraw> draws(n);
    std::vector<std::uint64_t> lo(members_.size(), UINT64_MAX), hi(members_.size(), 0);
    for (std::uint32_t j = 0; j < n; ++j) {
        draws[j] = (*order_)[first + j];
        lo[draws[j].member] = std::min(lo[draws[j].member], draws[j].local);
        hi[draws[j].member] = std::max(hi[draws[j].member], draws[j].local + 1);
    }
    // A fill interrupted while a member waits for its readers (interrupt.hpp)
    // has staged what it read: called again, next() goes on from there.
    for (std::size_t i = 0; i < members_.size(); ++i)
        if (hi[i] > 0) fill(members_[i], i, lo[i], hi[i]);
    ++next_;
    const RowTable t = backing_->table();
    for (std::uint32_t j = 0; j < n; ++j) {
        Member& m = members_[draws[j].member];
        t.staging_row[j] = draws[j].member * ring_rows_ + draws[j].local % ring_rows_;
        t.dataset[j] = static_cast<std::int32_t>(draws[j].member);
        if (wants_index_) t.index[j] = static_cast<std::int64_t>((*m.epoch_order)[draws[j].local]);
        m.delivered += 1;
    }
    backing_->upload(n);
    for (std::size_t f = 0; f < slot_.size(); ++f) {
        if (stored_[f] != std::string::npos)
            backing_->gather(slot_[f], staging_[stored_[f]], field_bytes_[f], n);
        else
            backing_->put(slot_[f],
                          batch_.fields[f].name == dataset_field ? static_cast<const void*>(t.dataset)
                                                                 : static_cast<const void*>(t.index),
                          std::uint64_t{n} * field_bytes_[f]);
    }
    point(batch_, n, [&](std::size_t f) { return slot_[f]; });
    hash_.add(batch_);
    times_.batches += 1;
    times_.samples += n;
    times_.bytes += std::uint64_t{n} * batch_.sample_bytes();
    return &batch_;
}

StageTimes MixBatchSource::take_times() {
    StageTimes t = std::exchange(times_, {});
    for (Member& m : members_) {
        const StageTimes mt = m.source->take_times();
        t.read += mt.read;
        t.decode += mt.decode;
        t.h2d += mt.h2d;
        t.io.merge(mt.io);
        t.cache_peak += mt.cache_peak;
    }
    hash_.take(t);
    return t;
}

std::uint64_t MixBatchSource::device_bytes() const {
    std::uint64_t bytes = plan_.mix_bytes;
    for (const Member& m : members_) bytes += m.source->device_bytes();
    return bytes;
}

std::uint64_t MixBatchSource::host_bytes() const {
    std::uint64_t bytes = plan_.members[0].source.config.device.backend == Backend::cpu ? plan_.mix_bytes : 0;
    for (const Member& m : members_) bytes += m.source->host_bytes();
    return bytes;
}

std::uint64_t MixBatchSource::host_resident() const {
    std::uint64_t bytes = plan_.members[0].source.config.device.backend == Backend::cpu ? plan_.mix_bytes : 0;
    for (const Member& m : members_) bytes += m.source->host_resident();
    return bytes;
}

} // namespace

std::unique_ptr<MixSource> make_mix_source(const std::vector<const Dataset*>& members, const MixPlan& plan) {
    if (members.size() != plan.members.size())
        throw std::logic_error("make_mix_source: " + std::to_string(members.size()) + " datasets for a plan of " +
                               std::to_string(plan.members.size()));
    return std::make_unique<MixBatchSource>(members, plan);
}

std::uint64_t mix_source_bytes(const MixPlan& plan, const Device& device) {
    const std::uint64_t b = plan.batch, ring = 2 * b;
    std::uint64_t bytes = 0;
    for (const BatchField& f : plan.fields) {
        if (f.name != dataset_field && f.name != index_field) bytes += plan.members.size() * ring * f.sample_bytes();
        bytes += b * f.sample_bytes();
    }
    if (device.backend == Backend::cuda) bytes += b * sizeof(std::uint64_t);
    return bytes;
}

} // namespace dstk::data
