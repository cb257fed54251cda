// dsbench loader cases: the data path of dstrain with no model. Each case
// delivers batches into GPU memory (host memory without a GPU) through one
// placement in one order, as dstrain would, and reads every byte of each
// batch once (as a model's first layer does; without it a resident split in
// sequential order would be slices that nothing reads, and its "rate" the
// speed of pointer arithmetic): the ceiling the data path sets for training.
// A timed pass delivers --size bytes (at most an epoch). Metrics follow every
// other case: rate (B/s) and samples_rate.
// Registered by add_loader_cases (registry.cpp lists the groups).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "dstk/bench/case.hpp"
#include "dstk/data/batch_source.hpp"
#include "dstk/dataset.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/units.hpp"
#include "dstk/thread_pool.hpp"
#if defined(DSTK_HAVE_CUDA)
#include "dstk/data/gpu_ops.hpp"
#endif

namespace dstk::bench {
namespace {

bool have_gpu() {
    return built_with_cuda() && !detect_gpus().empty();
}

std::optional<std::string> waive_loader(const CaseContext& ctx, data::Placement p) {
    if (auto why = needs_target(ctx)) return why;
    if (!ctx.target->dataset_dir) return "needs a dataset directory (the loader reads its train split)";
    const std::uint64_t split_bytes = ctx.target->data_bytes + ctx.target->samples() * 4;
    if (p == data::Placement::managed) {
        if (!built_with_cuda()) return "managed memory needs CUDA (this dsbench was built without it)";
        std::string why;
        const auto gpus = detect_gpus(&why);
        if (gpus.empty()) return "managed memory needs a CUDA GPU (" + why + ")";
        // Managed memory beyond a quarter of free GPU memory can stall a shared GPU.
        if (split_bytes > gpus[0].free_memory / 4)
            return "split of " + format_bytes(split_bytes) + " is larger than a quarter of free GPU memory (" +
                   format_bytes(gpus[0].free_memory) + " free; managed oversubscription is not measured)";
    }
    if (p == data::Placement::device) {
        // The whole split is loaded: into GPU memory, or host memory without a GPU.
        const auto gpus = built_with_cuda() ? detect_gpus() : std::vector<GpuInfo>{};
        const std::uint64_t room = gpus.empty() ? detect_system().memory.available / 2 : gpus[0].free_memory / 10 * 9;
        if (split_bytes > room)
            return "split of " + format_bytes(split_bytes) + " does not fit in " +
                   (gpus.empty() ? "half of available RAM (" : "90% of free GPU memory (") + format_bytes(room) + ")";
    }
    return std::nullopt;
}

// Reads every byte of a host batch once; the fold keeps the reads.
std::uint64_t consume_host(const void* x, std::uint64_t bytes) {
    const auto* b = static_cast<const std::uint8_t*>(x);
    std::uint64_t acc = 0, w = 0;
    std::uint64_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        std::memcpy(&w, b + i, 8);
        acc ^= w;
    }
    for (; i < bytes; ++i) acc ^= b[i];
    return acc;
}

std::vector<CaseResult> run_loader(const CaseContext& ctx, data::Placement p, data::Order o, bool direct) {
    const Dataset ds = Dataset::open(*ctx.target->dataset_dir);
    data::SourceConfig c;
    c.placement = p;
    const bool gpu = have_gpu();
    c.device = {gpu ? Backend::cuda : Backend::cpu, 0};
    c.order = {o, ctx.settings.seed, std::max<std::uint64_t>(1, ctx.settings.chunk_bytes / ctx.target->sample_bytes),
               8};
    c.batch = static_cast<std::uint32_t>(ctx.settings.batch_samples);
    c.prefetch = 4;
    c.readers = std::min(4u, hardware_threads());
    c.direct = direct;
    void* stream = nullptr;
    unsigned long long* sink = nullptr;
#if defined(DSTK_HAVE_CUDA)
    if (gpu) {
        stream = data::gpu::stream_create();
        sink = static_cast<unsigned long long*>(data::gpu::device_alloc(sizeof(unsigned long long)));
    }
#endif
    c.compute_stream = stream;
    struct StreamGuard {
        void* s;
        void* sink;
        ~StreamGuard() {
#if defined(DSTK_HAVE_CUDA)
            if (s) data::gpu::stream_destroy(s);
            if (sink) data::gpu::device_free(sink);
#endif
        }
    } guard{stream, sink};
    std::uint64_t folded = 0;
    const auto consume = [&](const Batch& b) {
        for (const BatchField& f : b.fields) {
            const std::uint64_t bytes = std::uint64_t{b.size} * f.sample_bytes();
#if defined(DSTK_HAVE_CUDA)
            if (gpu) {
                data::gpu::consume_async(f.data, bytes, sink, stream);
                continue;
            }
#endif
            folded ^= consume_host(f.data, bytes);
        }
    };
    auto src = data::make_batch_source(ds, ctx.target->split, c);
    const std::uint64_t batch_bytes = std::uint64_t{c.batch} * (ctx.target->sample_bytes + 4);
    const std::uint64_t batches =
        std::max<std::uint64_t>(1, std::min(src->batches_per_epoch(), ctx.settings.size_bytes / batch_bytes));
    std::uint64_t epoch = 0, samples = 0;
    const auto seconds = time_repetitions(
        ctx.settings.repeat, [&] { src->start_epoch(epoch++, 0); },
        [&] {
            const auto t0 = std::chrono::steady_clock::now();
            samples = 0;
            for (std::uint64_t i = 0; i < batches; ++i) {
                const Batch* b = src->next();
                if (!b) break;
                consume(*b);
                samples += b->size;
                src->release();
            }
#if defined(DSTK_HAVE_CUDA)
            if (stream) data::gpu::stream_synchronize(stream);
#endif
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
    CaseResult r;
    r.params = {{"placement", data::placement_name(p)},
                {"order", data::order_name(o)},
                {"batch", c.batch},
                {"readers", c.readers},
                {"prefetch", c.prefetch},
                {"device", gpu ? "cuda:0" : "cpu"},
                {"direct", direct},
                {"host_bytes", src->host_bytes()},
                {"batches_per_pass", batches},
                {"fold", folded}};
    r.repetitions = static_cast<unsigned>(seconds.size());
    r.metrics["rate"] = rate_metric(static_cast<double>(samples * (ctx.target->sample_bytes + 4)), seconds, "B/s");
    r.metrics["samples_rate"] = rate_metric(static_cast<double>(samples), seconds, "samples/s");
    return {r};
}

} // namespace

void add_loader_cases(CaseRegistry& reg) {
    for (const data::Placement p : {data::Placement::device, data::Placement::stream, data::Placement::managed})
        for (const data::Order o : {data::Order::sequential, data::Order::chunk, data::Order::full}) {
            const std::string pn(data::placement_name(p)), on(data::order_name(o));
            reg.add(Case{"loader." + pn + "." + on,
                         "batches delivered into GPU memory (host memory without a GPU) by dstrain's " + pn +
                             " placement in " + on + " order and read once, no model",
                         p != data::Placement::managed, [p](const CaseContext& ctx) { return waive_loader(ctx, p); },
                         [p, o](const CaseContext& ctx) { return run_loader(ctx, p, o, false); }});
        }
    for (const data::Order o : {data::Order::sequential, data::Order::chunk, data::Order::full}) {
        const std::string on(data::order_name(o));
        reg.add(Case{"loader.stream.direct." + on,
                     "as loader.stream." + on + ", the input read with O_DIRECT (dstrain --direct)", true,
                     [](const CaseContext& ctx) { return waive_loader(ctx, data::Placement::stream); },
                     [o](const CaseContext& ctx) { return run_loader(ctx, data::Placement::stream, o, true); }});
    }
}

} // namespace dstk::bench
