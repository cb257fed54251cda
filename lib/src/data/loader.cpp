// The converted-batch engine (loader.hpp): planning, the fields' kinds, and
// the cpu backend's batches; loader_device.cpp holds the cuda backend's
// slots and feeder.
#include "dstk/data/loader.hpp"

#include <algorithm>
#include <utility>

#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/data/interrupt.hpp"
#include "dstk/data/mix_source.hpp"
#include "loader_slots.hpp"

namespace dstk::data {
namespace {

bool is_integer(DType t) {
    return !is_float(t);
}

// The kind a field gets without an explicit one. labels64 widens an integer
// label role even where nothing else is converted (PyTorch's losses take int64).
FieldKind default_kind(const Manifest& m, const BatchField& f, const LoaderRequest& r, bool mix) {
    if (mix && (f.name == dataset_field || f.name == index_field)) return FieldKind::stored;
    const bool label = f.name == m.label_field && is_integer(f.dtype);
    if (label && r.labels64) return FieldKind::classes64;
    if (!r.convert) return FieldKind::stored;
    if (f.name == m.input_field) return r.normalize ? FieldKind::normalised : FieldKind::values;
    return label ? FieldKind::classes32 : FieldKind::values;
}

// The input's statistics: given (mean and std together, one per channel), or field_norm's.
// The statistics of a field: field_norm's, or over a mix its members' (mix_field_norm).
struct Norms {
    const std::vector<Dataset>& datasets;
    const MixPlan* mix;
    ChannelNorm operator()(const std::string& field) const {
        if (!mix) return field_norm(datasets[0], field, "train");
        std::vector<const Dataset*> members;
        std::vector<std::uint64_t> draws;
        for (std::size_t i = 0; i < datasets.size(); ++i) {
            members.push_back(&datasets[i]);
            draws.push_back(mix->members[i].quota);
        }
        return mix_field_norm(members, draws, field);
    }
};

ChannelNorm input_norm(const Norms& norms, const BatchField& f, const LoaderRequest& r) {
    const SettingNames& names = r.source.names;
    if (r.mean.empty() != r.std.empty())
        throw usage_error(spell(names, "mean") + " and " + spell(names, "std") +
                          " are given together (one without the other cannot normalise)");
    if (r.mean.empty()) return norms(f.name);
    ChannelNorm n;
    const std::uint64_t channels = stats_channels(f.shape);
    if (r.mean.size() != channels || r.std.size() != channels)
        throw usage_error(spell(names, "mean") + " and " + spell(names, "std") + " have " +
                          std::to_string(r.mean.size()) + " and " + std::to_string(r.std.size()) + " values but '" +
                          f.name + "' (" + f.shape.str() + ") has " + std::to_string(channels) +
                          " channels; give one per channel");
    for (const float s : r.std)
        if (!(s > 0)) throw usage_error(spell(names, "std") + " values must be positive (they divide)");
    n.mean = r.mean;
    n.std = r.std;
    n.per_channel = f.shape.numel() / channels;
    n.source = "given";
    return n;
}

std::vector<FieldOutput> outputs_of(const Norms& norms, const SourcePlan& plan, const LoaderRequest& r) {
    const Dataset& ds = norms.datasets[0];
    for (const auto& entry : r.kinds) {
        const std::string& name = entry.first; // not a structured binding: clang 14 cannot capture one
        if (std::none_of(plan.fields.begin(), plan.fields.end(), [&](const BatchField& f) { return f.name == name; }))
            throw usage_error(spell(r.source.names, "convert") + " names '" + name +
                              "', which is not among the fields delivered; name one of the fields");
    }
    std::vector<FieldOutput> out;
    for (const BatchField& f : plan.fields) {
        FieldOutput o{f.name, f.dtype, f.dtype, f.shape, default_kind(ds.manifest(), f, r, norms.mix != nullptr), {}};
        if (const auto it = r.kinds.find(f.name); it != r.kinds.end()) o.kind = it->second;
        if ((o.kind == FieldKind::classes32 || o.kind == FieldKind::classes64) && !is_integer(f.dtype))
            throw usage_error("'" + f.name + "' is " + std::string(dtype_name(f.dtype)) +
                              ", not integer classes; convert it to float values, or keep it as stored");
        o.dtype = converted_dtype(o.kind, f.dtype);
        if (o.kind == FieldKind::normalised) {
            o.norm = f.name == ds.manifest().input_field ? input_norm(norms, f, r) : norms(f.name);
            o.norm.per_channel = f.shape.numel() / o.norm.mean.size();
        }
        out.push_back(std::move(o));
    }
    return out;
}

SourceRequest resolved_source(const LoaderRequest& r) {
    SourceRequest s = r.source;
    if (!r.device_auto) return s;
    std::string why;
    s.device = default_device(&why);
    if (s.device.backend == Backend::cpu && s.notice)
        s.notice("no GPU (" + why + "): batches in host memory, converted on the CPU");
    return s;
}

std::vector<Dataset> open_all(const std::vector<std::filesystem::path>& dirs) {
    std::vector<Dataset> out;
    for (const std::filesystem::path& d : dirs) out.push_back(Dataset::open(d));
    return out;
}

// A mix's plan as one source's: its samples, batches, fields and ceilings
// over the first member's settings.
SourcePlan mix_as_source(const MixPlan& m) {
    SourcePlan p = m.members[0].source;
    p.fields = m.fields;
    p.samples = m.positions;
    p.batches = m.batches;
    p.host_bytes = m.host_bytes;
    p.device_bytes = m.device_bytes;
    p.config.drop_last = m.drop_last;
    p.config.slice = m.slice;
    return p;
}

} // namespace

Loader::Loader(const std::filesystem::path& dir, const LoaderRequest& r)
    : Loader(std::vector<std::filesystem::path>{dir}, r) {}

Loader::Loader(const std::vector<std::filesystem::path>& dirs, const LoaderRequest& r)
    : datasets_(open_all(dirs)), keep_(r.keep) {
    if (keep_ == 0)
        throw usage_error("invalid " + spell(r.source.names, "keep") +
                          " 0 (a consumer holds at least the batch it was given)");
    if (dirs.size() < 2 && (!r.weights.empty() || !r.mix_placements.empty()))
        throw usage_error(spell(r.source.names, r.weights.empty() ? "placement" : "weights") +
                          " per dataset applies to a mix (" + std::to_string(dirs.size()) +
                          " dataset given); give two or more datasets");
    SourceRequest s = resolved_source(r);
    if (s.device.backend == Backend::cuda && built_with_cuda()) {
        slots_ = make_device_slots(s.device, keep_ + 1 + ahead);
        s.compute_stream = slots_->stream();
    }
    std::vector<const Dataset*> members;
    for (const Dataset& d : datasets_) members.push_back(&d);
    if (datasets_.size() > 1) {
        mix_ = plan_mix(members, {s, r.weights, r.mix_placements}, machine_facts(s.device));
        plan_ = mix_as_source(*mix_);
    } else {
        s.rows = slots_ != nullptr; // feed_one converts each batch on the slots' stream as it comes (no gather)
        plan_ = plan_source(datasets_[0], s, machine_facts(s.device));
    }
    outputs_ = outputs_of(Norms{datasets_, mix_plan()}, plan_, r);
    for (const FieldOutput& o : outputs_) {
        inv_std_.emplace_back();
        for (const float v : o.norm.std) inv_std_.back().push_back(1.0f / v);
    }
    if (slots_) {
        slots_->allocate(plan_.config.batch, outputs_, inv_std_);
        sizes_.assign(slots(), 0);
    }
    if (mix_)
        source_ = make_mix_source(members, *mix_);
    else
        source_ = make_batch_source(datasets_[0], plan_);
}

Loader::~Loader() {
    stop_feeder();
    source_.reset(); // its slots are freed once our stream is done with them
}

unsigned Loader::slots() const {
    return keep_ + 1 + ahead;
}

// The conversion of batch `b` into out[f]; the statistics from the host
// (cpu) or from the slots' device copies (cuda).
std::vector<FieldConversion> Loader::conversions(const Batch& b, std::span<void* const> out, bool device) const {
    std::vector<FieldConversion> c;
    for (std::size_t f = 0; f < outputs_.size(); ++f) {
        const FieldOutput& o = outputs_[f];
        FieldConversion fc;
        fc.src = b.fields[f].data;
        fc.rows = b.fields[f].rows;
        fc.dtype = o.stored;
        fc.per_sample = o.shape.numel();
        fc.dst = out[f];
        fc.kind = o.kind;
        if (o.kind == FieldKind::normalised) {
            fc.mean = device ? slots_->mean(f) : o.norm.mean.data();
            fc.inv_std = device ? slots_->inv_std(f) : inv_std_[f].data();
            fc.hw = o.norm.per_channel;
        }
        c.push_back(fc);
    }
    return c;
}

void Loader::start_epoch(std::uint64_t epoch, std::uint64_t first_batch) {
    if (!on_gpu()) {
        std::lock_guard lock(source_mutex_);
        return source_->start_epoch(epoch, first_batch);
    }
    stop_feeder(); // batches it converted ahead for the abandoned iteration are dropped
    {
        std::lock_guard lock(source_mutex_);
        source_->start_epoch(epoch, first_batch);
    }
    wait_seconds_ = 0;
    start_feeder();
}

void Loader::stop() {
    stop_feeder();
    std::lock_guard lock(source_mutex_);
    source_->stop();
}

std::uint32_t Loader::next_host(std::span<void* const> out) {
    if (out.size() != outputs_.size()) throw std::logic_error("Loader::next_host: one buffer per output field");
    std::lock_guard lock(source_mutex_);
    const Batch* batch = source_->next();
    if (!batch) return 0;
    try {
        convert_fields_host(conversions(*batch, out, false), batch->size);
    } catch (...) {
        source_->release();
        throw;
    }
    source_->release();
    return batch->size;
}

StageTimes Loader::take_times() {
    StageTimes t;
    {
        // The source's user (the consumer on the cpu backend, the feeder on
        // cuda) holds it while it waits for a batch, which may be a read
        // that never returns.
        const auto lock = lock_interruptible(source_mutex_);
        t = source_->take_times();
    }
    if (!on_gpu()) return t;
    std::lock_guard lock(mutex_);
    t.read_wait = std::exchange(wait_seconds_, 0.0);
    return t;
}

std::uint64_t Loader::host_bytes() const {
    if (on_gpu()) return plan_.host_bytes;
    std::uint64_t per_batch = 0;
    for (const FieldOutput& o : outputs_) per_batch += std::uint64_t{batch()} * o.sample_bytes();
    return plan_.host_bytes + std::uint64_t{keep_ + 1} * per_batch;
}

std::uint64_t Loader::device_bytes() const {
    return source_->device_bytes() + (slots_ ? slots_->bytes() : 0);
}

} // namespace dstk::data
