// Host-to-device cases: pageable, pinned, managed (faults, prefetch,
// PreferredLocation=CPU + AccessedBy=GPU) and zero-copy, over --transfer-sizes.
#include "dstk/bench/case.hpp"
#include "dstk/bench/gpu.hpp"
#include "dstk/error.hpp"

namespace dstk::bench {
namespace {

std::vector<CaseResult> run_transfer(const CaseContext& ctx, Transfer kind) {
    std::vector<CaseResult> results;
    for (std::uint64_t size : ctx.settings.transfer_sizes) {
        CaseResult r;
        r.variant = variant_size(size);
        r.params = {{"transfer_bytes", size}};
        try {
            TransferBench bench(kind, size);
            const std::uint64_t ops = bench.ops_per_run();
            const auto seconds = time_repetitions(
                ctx.settings.repeat, [&] { bench.prepare(); }, [&] { return bench.run(); });
            r.params["transfers_per_repetition"] = ops;
            r.repetitions = static_cast<unsigned>(seconds.size());
            r.metrics["rate"] = rate_metric(double(size) * double(ops), seconds, "B/s");
            r.metrics["ops_rate"] = rate_metric(double(ops), seconds, "ops/s");
        } catch (const Error& e) {
            if (e.code() == ExitCode::interrupted) throw;
            // A size that does not fit is waived; the other sizes still run.
            r.status = e.code() == ExitCode::no_fit ? CaseStatus::waived : CaseStatus::failed;
            r.reason = e.what();
        }
        results.push_back(std::move(r));
    }
    return results;
}

} // namespace

void add_transfer_cases(CaseRegistry& reg) {
    struct Kind {
        Transfer kind;
        const char* what;
    };
    for (const Kind& k :
         {Kind{Transfer::pageable, "cudaMemcpyAsync from pageable (malloc) memory"},
          Kind{Transfer::pinned, "cudaMemcpyAsync from pinned (cudaHostAlloc) memory"},
          Kind{Transfer::managed_fault, "kernel reads host-resident managed memory (page faults)"},
          Kind{Transfer::managed_prefetch, "cudaMemPrefetchAsync of host-resident managed memory"},
          Kind{Transfer::managed_accessed_by, "kernel reads managed memory, PreferredLocation=CPU + AccessedBy=GPU"},
          Kind{Transfer::zero_copy, "kernel reads mapped pinned host memory (zero-copy)"}}) {
        Case c;
        c.key = "h2d." + std::string(transfer_name(k.kind));
        c.description = std::string(k.what) + ", --transfer-sizes sweep";
        c.waive = [](const CaseContext&) { return gpu_unavailable(); };
        c.run = [kind = k.kind](const CaseContext& ctx) { return run_transfer(ctx, kind); };
        reg.add(std::move(c));
    }
}

} // namespace dstk::bench
