// plan_source: the data path's decisions, once (source_plan.hpp lists them).
#include "dstk/data/source_plan.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "dstk/bench/results.hpp"
#include "dstk/data/tuning.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"
#include "random_reads.hpp"
#include "memory_plan.hpp"
#include "source_fields.hpp"

namespace dstk::data {
namespace {

constexpr std::uint64_t default_chunk_bytes = 4ull << 20;
constexpr unsigned default_prefetch = 4, default_readers = 2;

struct Names {
    const SettingNames& names;
    std::string operator()(std::string_view setting) const { return spell(names, setting); }
};

// Usage errors found from the request alone, and a GPU asked for that this
// build or machine does not have.
void check_request(const SourceRequest& r, const MachineFacts& m) {
    const Names name{r.names};
    if (r.batch == 0) throw usage_error("invalid " + name("batch") + " 0 (must be positive)");
    if (r.prefetch && *r.prefetch == 0)
        throw usage_error("invalid " + name("prefetch") + " 0 (the ring needs at least 1 slot)");
    if (r.readers && *r.readers == 0) throw usage_error("invalid " + name("readers") + " 0 (at least 1 reader thread)");
    if (r.window == 0) throw usage_error("invalid " + name("window") + " 0 (must be at least 1 chunk)");
    if (r.device.backend == Backend::cuda && !built_with_cuda())
        throw no_fit_error(name("device") + " " + device_name(r.device) + " (built without CUDA support) use " +
                           name("device") + " cpu");
    if (r.device.backend == Backend::cuda && !m.gpu_free)
        throw no_fit_error(name("device") + " " + device_name(r.device) + " (" + m.gpu_missing + ") use " +
                           name("device") + " cpu, or check the GPU and its driver with nvidia-smi");
    if (r.placement == Placement::managed && r.device.backend != Backend::cuda)
        throw usage_error(name("placement") + " managed needs a CUDA device (managed memory is GPU memory); use " +
                          name("placement") + " stream or " + name("placement") + " device with " + name("device") +
                          " cpu");
}

void check_split(const Dataset& ds, const SplitInfo& split, const SourceRequest& r) {
    const Names name{r.names};
    if (split.samples == 0)
        throw usage_error("split '" + split.name + "' of " + ds.dir().string() +
                          " is empty (no samples to read); regenerate the dataset with samples in it");
    if (r.drop_last && std::uint64_t{r.batch} * r.slice.world > split.samples)
        throw usage_error((r.slice.world > 1 ? "the global batch " + std::to_string(r.slice.world) + " x " +
                                                   name("batch") + " " + std::to_string(r.batch)
                                             : name("batch") + " " + std::to_string(r.batch)) +
                          " is larger than split '" + split.name + "' (" + format_count(split.samples) +
                          " samples); use a smaller " + name("batch"));
}

// The configuration the request sets as it is (the decisions come after).
SourceConfig base_config(const SourceRequest& r) {
    SourceConfig c;
    c.fields = r.fields;
    c.placement = r.placement;
    c.device = r.device;
    c.order = {r.order, r.seed, r.chunk_samples, r.window};
    c.batch = r.batch;
    c.slice = r.slice;
    c.drop_last = r.drop_last;
    c.prefetch = r.prefetch.value_or(default_prefetch);
    c.readers = r.readers.value_or(default_readers);
    c.managed_policy = r.managed_policy;
    c.oversubscribe = r.oversubscribe;
    c.compute_stream = r.compute_stream;
    c.rows = r.rows;
    c.direct = r.direct.value_or(false);
    c.host_mem = r.host_mem;
    c.hash_batches = r.hash_batches;
    c.notice = r.notice;
    c.warn = r.warn;
    c.names = r.names;
    return c;
}

// The order's chunk: a zstd-chunked lead field's own, else the request's,
// else about 4 MiB of the lead field.
void plan_chunk(const SourceFields& f, const SourceRequest& r, SourceConfig& c) {
    c.order.chunk_samples =
        r.chunk_samples
            ? r.chunk_samples
            : std::max<std::uint64_t>(1, default_chunk_bytes / std::max<std::uint64_t>(1, f[f.lead()].sample_bytes()));
    c.order = f.order(c.order);
}

void plan_tuning(const SourceFields& f, const SourceRequest& r, const MachineFacts& m, SourcePlan& p) {
    if (r.bench.empty()) return;
    const bench::Results results = bench::load_results(r.bench);
    const LoaderTuning t = tune_loader(results, r.order, f.row_bytes(), r.batch, m.hardware_threads, r.prefetch,
                                       r.readers, default_prefetch, default_readers, r.names);
    p.config.prefetch = t.prefetch;
    p.config.readers = t.readers;
    for (const std::string& line : t.why)
        p.tuning.push_back(spell(r.names, "bench") + " " + r.bench.string() + ": " + line);
}

// Auto placement: device while `bytes` (of `what`) fit the room, else stream.
Placement resolve_placement(const SourceRequest& r, const MachineFacts& m, std::uint64_t bytes, const std::string& what,
                            std::string& why) {
    if (r.placement != Placement::automatic) {
        why = spell(r.names, "placement") + " " + std::string(placement_name(r.placement));
        return r.placement;
    }
    std::uint64_t room = 0;
    std::string where;
    if (r.device.backend == Backend::cuda) {
        room = m.gpu_free.value_or(0) / 10 * 9;
        room = room > r.reserved_device_bytes ? room - r.reserved_device_bytes : 0;
        where = "90% of free GPU memory less the model";
    } else {
        room = m.host_available / 2;
        where = "half of available RAM";
    }
    if (bytes <= room) {
        why = what + " (" + format_bytes(bytes) + ") fit in " + where + " (" + format_bytes(room) + ")";
        return Placement::device;
    }
    why = what + " (" + format_bytes(bytes) + ") exceed " + where + " (" + format_bytes(room) + "): streaming them";
    return Placement::stream;
}

// The managed split must fit the GPU's free memory unless oversubscription was asked for.
void check_managed(const SourcePlan& p, const SourceRequest& r, const MachineFacts& m,
                   std::vector<std::string>& warnings) {
    const Names name{r.names};
    const std::uint64_t free_b = m.gpu_free.value_or(0);
    if (p.split_bytes > free_b && !r.oversubscribe)
        throw no_fit_error(name("placement") + " managed: split '" + p.split + "' needs " +
                           format_bytes(p.split_bytes) + " but the GPU has " + format_bytes(free_b) +
                           " free (oversubscribing managed memory can slow training 100x under random access); use " +
                           name("placement") + " stream, or " + name("oversubscribe") + " to allow it");
    if (p.split_bytes > free_b)
        warnings.push_back(name("oversubscribe") + ": managed split of " + format_bytes(p.split_bytes) +
                           " exceeds the GPU's " + format_bytes(free_b) +
                           " free; speed can collapse under random access (" + name("order") + " full)");
}

// The stream's host memory; O_DIRECT, where not asked either way, exactly
// where the plan would drop pages (the split does not fit in the page cache
// beside the stream): buffered reads under reclaim reached well under the
// disk's rate where O_DIRECT reached it (bench-larger-than-ram).
void plan_stream(const SourceFields& f, const SourceRequest& r, const MachineFacts& m, SourcePlan& p) {
    const std::uint64_t avail = m.host_available;
    p.host = plan_host_memory(f.split(), f.list(), p.config, avail);
    if (p.host.drop_pages && !r.direct) {
        p.config.direct = true;
        p.direct_why = "reading with O_DIRECT: the data (" + format_bytes(p.split_bytes) +
                       ") does not fit in the memory available beside the stream (" + format_bytes(avail) +
                       "), so the page cache cannot hold it; " + spell(r.names, "direct") +
                       " off reads through the page cache";
        p.host = plan_host_memory(f.split(), f.list(), p.config, avail);
    }
    p.config.host = p.host;
    p.host_bytes = p.host.total();
}

// The full order on a stream reads single samples at random. Where the split
// is larger than the memory available, the page cache cannot hold it: predict
// the rate from bench's random-read figures or a short probe, and say what an
// epoch will cost and what to do instead.
void warn_full_order(const Dataset& ds, const SourceFields& f, const SourceRequest& r, const MachineFacts& m,
                     SourcePlan& p) {
    const Names name{r.names};
    const std::string instead = "dsconvert --shuffle SEED " + ds.dir().string() + " SHUFFLED once, then " +
                                name("order") +
                                " chunk on SHUFFLED (sequential reads of whole chunks, a global shuffle)";
    const std::string what = name("order") + " full with " + name("placement") + " stream";
    if (p.split_bytes <= m.host_available) {
        p.warnings.push_back(what +
                             " reads samples at random from the files: fast only while they are in the page "
                             "cache (the split, " +
                             format_bytes(p.split_bytes) + ", fits in the " + format_bytes(m.host_available) +
                             " available); otherwise " + instead);
        return;
    }
    const FieldInfo& lead = f[f.lead()];
    const RandomReadRate rr = predict_random_reads(ds, f.split(), lead, r.bench, p.config.readers);
    const double per_s = rr.samples_per_second;
    const double epoch_s = per_s > 0 ? static_cast<double>(p.samples) / per_s : 0;
    p.warnings.push_back(what + " on a split of " + format_bytes(p.split_bytes) + ", larger than the " +
                         format_bytes(m.host_available) + " of memory available: every sample is a random read of " +
                         format_bytes(lead.sample_bytes()) + "; " + rr.source + " predicts about " +
                         format_count(static_cast<std::uint64_t>(per_s)) + " samples/s with " +
                         std::to_string(p.config.readers) + " readers, an epoch in about " + format_duration(epoch_s) +
                         ". Instead: " + instead);
}

// Host memory of a resident placement: the cpu backend's split and batch slot
// (its "device" memory), the managed split's pages, or the staging buffer a
// device placement loads the split through.
std::uint64_t resident_host_bytes(const SourceFields& f, const SourceConfig& c, std::uint64_t device_bytes) {
    if (c.device.backend == Backend::cpu) return device_bytes;
    if (c.placement == Placement::managed) return checked_mul(f.samples(), f.row_bytes(), "split bytes");
    std::uint64_t staging = 0;
    for (std::size_t i = 0; i < f.size(); ++i) staging = std::max(staging, staging_bytes(f[i].sample_bytes()));
    return staging;
}

// The plan of one split with its placement resolved by the caller (`why`).
SourcePlan plan_resolved(const Dataset& ds, const SourceRequest& r, const MachineFacts& m, Placement placement,
                         std::string why) {
    const SplitInfo& split = ds.manifest().split(r.split);
    SourcePlan p;
    p.dataset = ds.dir();
    p.split = split.name;
    p.config = base_config(r);
    const SourceFields f(split, source_fields(ds.manifest(), split, p.config));
    check_split(ds, split, r);
    p.fields = f.batch().fields;
    p.lead_field = f[f.lead()].name;
    p.samples = split.samples;
    p.sample_bytes = f.row_bytes();
    p.split_bytes = checked_mul(split.samples, p.sample_bytes, "split bytes");
    p.batches = r.slice.batches(split.samples, r.batch, r.drop_last);
    plan_chunk(f, r, p.config);
    plan_tuning(f, r, m, p);
    p.config.placement = placement;
    p.placement_why = std::move(why);
    if (placement == Placement::managed) check_managed(p, r, m, p.warnings);
    if (placement == Placement::stream) {
        plan_stream(f, r, m, p);
        if (r.order == Order::full) warn_full_order(ds, f, r, m, p);
    } else {
        p.config.direct = false;
        if (r.direct.value_or(false))
            p.notes.push_back(spell(r.names, "direct") + " applies to " + spell(r.names, "placement") +
                              " stream only; the " + std::string(placement_name(placement)) +
                              " placement loads the split once");
    }
    p.device_bytes = planned_device_bytes(split, f.list(), p.config);
    if (placement != Placement::stream) p.host_bytes = resident_host_bytes(f, p.config, p.device_bytes);
    return p;
}

} // namespace

MachineFacts machine_facts(const Device& device) {
    MachineFacts m;
    m.host_available = available_host_memory();
    m.hardware_threads = hardware_threads();
    if (device.backend != Backend::cuda) return m;
    std::string why;
    const std::vector<GpuInfo> gpus = detect_gpus(&why);
    for (const GpuInfo& g : gpus)
        if (g.index == device.index) m.gpu_free = g.free_memory;
    if (!m.gpu_free)
        m.gpu_missing = gpus.empty() ? why
                                     : "no such GPU: this machine has " + std::to_string(gpus.size()) +
                                           ", cuda:0 to cuda:" + std::to_string(gpus.size() - 1);
    return m;
}

Device default_device(std::string* why) {
    if (!detect_gpus(why).empty()) return {Backend::cuda, 0};
    return {Backend::cpu, 0};
}

SourcePlan plan_source(const Dataset& ds, const SourceRequest& r, const MachineFacts& m) {
    check_request(r, m);
    const SplitInfo& split = ds.manifest().split(r.split);
    SourceConfig c = base_config(r);
    const std::uint64_t bytes = checked_mul(
        split.samples, SourceFields(split, source_fields(ds.manifest(), split, c)).row_bytes(), "split bytes");
    std::string why;
    const Placement placement = resolve_placement(r, m, bytes, "the split", why);
    SourcePlan p = plan_resolved(ds, r, m, placement, std::move(why));
    if (r.placement == Placement::automatic && placement == Placement::stream)
        p.placement_why += "; host memory " + format_bytes(p.host_bytes) + " (ring + window cache) of " +
                           format_bytes(m.host_available) + " available";
    return p;
}

TrainingPlan plan_training(const Dataset& ds, const SourceRequest& r, std::string_view eval_split,
                           const MachineFacts& m) {
    check_request(r, m);
    const Manifest& man = ds.manifest();
    const SplitInfo* eval = eval_split.empty() ? nullptr : man.find(eval_split);
    if (eval && eval->samples == 0) eval = nullptr;
    SourceRequest er = r;
    if (eval) {
        er.split = eval->name;
        er.order = Order::sequential;
        er.drop_last = false;
        er.slice = {}; // every rank evaluates the whole split
        er.host_mem = 0;
        er.bench.clear(); // one set of tuning lines: the training source's
    }
    std::uint64_t bytes = 0;
    for (const SplitInfo* s : {&man.split(r.split), eval}) {
        if (!s) continue;
        const SourceConfig c = base_config(r);
        bytes = checked_add(
            bytes, checked_mul(s->samples, SourceFields(*s, source_fields(man, *s, c)).row_bytes(), "split bytes"),
            "split bytes");
    }
    std::string why;
    const Placement placement = resolve_placement(r, m, bytes, "the splits", why);
    TrainingPlan t;
    t.train = plan_resolved(ds, r, m, placement, why); // decides O_DIRECT and the tuning for both
    if (eval) {
        er.prefetch = t.train.config.prefetch; // the evaluation reads as the training does
        er.readers = t.train.config.readers;
        er.direct = t.train.config.direct;
        t.eval = plan_resolved(ds, er, m, placement, why);
    }
    if (t.eval && placement == Placement::stream) {
        // Evaluation streams with the least window cache; host_mem caps both.
        const HostPlan& least = t.eval->host;
        er.host_mem = least.ring + least.other + least.min_cache;
        t.eval = plan_resolved(ds, er, m, placement, why);
        if (r.host_mem) {
            if (r.host_mem <= er.host_mem)
                throw no_fit_error(spell(r.names, "host_mem") + " " + format_bytes(r.host_mem) +
                                   " leaves nothing for training: evaluating the test split takes " +
                                   format_bytes(er.host_mem) + "; raise " + spell(r.names, "host_mem") + " or lower " +
                                   spell(r.names, "window") + " or " + spell(r.names, "prefetch"));
            SourceRequest tr = r;
            tr.host_mem = r.host_mem - er.host_mem;
            tr.direct = t.train.config.direct;
            std::string direct_why = std::move(t.train.direct_why);
            t.train = plan_resolved(ds, tr, m, placement, why);
            t.train.direct_why = std::move(direct_why);
        }
    }
    if (r.placement == Placement::automatic && placement == Placement::stream)
        t.train.placement_why += "; host memory " + format_bytes(t.train.host_bytes) + " (ring + window cache) of " +
                                 format_bytes(m.host_available) + " available";
    return t;
}

} // namespace dstk::data
