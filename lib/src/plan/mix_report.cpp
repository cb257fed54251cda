#include "plan/mix_report.hpp"
#include "plan/data_path.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

#include <nlohmann/json.hpp>

#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/units.hpp"

namespace dstk::plan {
namespace {

// The members in the order plan_mix keeps them in memory: rows read per byte
// (share of the draws over the bytes), most first; ties keep the given order.
std::vector<std::size_t> keep_order(const std::vector<MixMemberSizes>& m, std::size_t dtype) {
    std::vector<std::size_t> order(m.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    const auto density = [&](std::size_t i) {
        return m[i].bytes[dtype] ? m[i].share / static_cast<double>(m[i].bytes[dtype]) : 0.0;
    };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return density(a) > density(b); });
    return order;
}

// The member's draws of an epoch as a data spec: what estimate_epoch sizes.
DataSpec draws_of(const NamedData& member, std::uint64_t draws) {
    DataSpec d = member.data;
    if (d.stored_bytes && d.train + d.test > 0) // the training split's share of the files, per draw
        d.stored_bytes = static_cast<std::uint64_t>(static_cast<double>(*d.stored_bytes) * static_cast<double>(draws) /
                                                    static_cast<double>(d.train + d.test));
    d.train = draws;
    d.test = 0;
    return d;
}

// The mix's epoch: each member's reads and copies by estimate_epoch's rules
// (device: none; host: from memory, or from disk in the first epoch; stream:
// from disk), summed (they share the disk and the link), against the GPU
// training every draw.
EpochEstimate mix_epoch(const std::vector<NamedData>& members, const data::MixPlan& p, const Job& j, const Rates& r,
                        double compute_rate, bool first) {
    EpochEstimate e;
    const auto add = [](std::optional<double>& sum, const std::optional<double>& t) {
        if (t) sum = sum.value_or(0) + *t;
    };
    for (std::size_t i = 0; i < members.size(); ++i) {
        const data::MixMemberPlan& m = p.members[i];
        const Fit where = m.placement == data::MixPlacement::device           ? Fit::device
                          : m.placement == data::MixPlacement::host && !first ? Fit::ram
                                                                              : Fit::disk;
        const EpochEstimate one = estimate_epoch(draws_of(members[i], m.quota), j, where, r, 0, false);
        e.read_bytes += one.read_bytes;
        e.transfer_bytes += one.transfer_bytes;
        add(e.read_seconds, one.read_seconds);
        add(e.decode_seconds, one.decode_seconds);
        add(e.transfer_seconds, one.transfer_seconds);
    }
    if (compute_rate > 0) e.compute_seconds = static_cast<double>(p.positions) / compute_rate;
    settle_epoch(e);
    return e;
}

std::string seconds_text(const std::optional<double>& s) {
    if (!s) return "unknown";
    char buf[32];
    std::snprintf(buf, sizeof buf, *s < 10 ? "%.2f s" : "%.1f s", *s);
    return buf;
}

std::string epoch_text(const EpochEstimate& e) {
    std::string t = seconds_text(e.epoch_seconds);
    if (e.limited_by) t += " (limited by " + std::string(data::stage_name(*e.limited_by)) + ")";
    t += ": disk " + (e.read_bytes ? seconds_text(e.read_seconds) + " for " + format_bytes(e.read_bytes) : "none");
    t += ", to the GPU " +
         (e.transfer_bytes ? seconds_text(e.transfer_seconds) + " for " + format_bytes(e.transfer_bytes) : "none");
    t += ", compute " + seconds_text(e.compute_seconds);
    const bool unknown =
        !e.compute_seconds || (e.read_bytes && !e.read_seconds) || (e.transfer_bytes && !e.transfer_seconds);
    if (unknown)
        t += (e.epoch_seconds ? "; at least that: " : "; ") +
             std::string("give --bench FILE from dsbench and --compute-rate from a dstrain run");
    return t;
}

nlohmann::json epoch_json(const EpochEstimate& e) {
    const auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    return {{"read_bytes", e.read_bytes},
            {"transfer_bytes", e.transfer_bytes},
            {"read_seconds", opt(e.read_seconds)},
            {"decode_seconds", opt(e.decode_seconds)},
            {"transfer_seconds", opt(e.transfer_seconds)},
            {"compute_seconds", opt(e.compute_seconds)},
            {"epoch_seconds", opt(e.epoch_seconds)},
            {"limited_by", e.limited_by ? nlohmann::json(data::stage_name(*e.limited_by)) : nlohmann::json(nullptr)}};
}

// What dstrain would ask of the mix, on the machine planned for: --gpu-mem
// plans for a GPU of that much free memory (on this machine or another),
// --ram for that much RAM, whose budget is the mix's host budget.
data::MixRequest mix_request(const PlanOptions& o, const DataSpec& sample, const Budgets& b,
                             std::optional<std::uint64_t> model_bytes, data::MachineFacts& machine) {
    data::MixRequest request;
    // Every field of the samples (the sizes count them all), whatever the roles.
    for (const FieldSpec& f : sample.fields) request.source.fields.push_back(f.name);
    request.source.placement = data::parse_placement(o.data, "--data");
    request.source.device = data::default_device();
    request.source.order = data::parse_order(o.order, "--order");
    request.source.batch = o.batch;
    if (o.bench.empty() || o.prefetch != PlanOptions{}.prefetch) request.source.prefetch = o.prefetch;
    request.source.bench = o.bench;
    request.source.reserved_device_bytes = model_bytes.value_or(0);
    request.source.names = plan_flag_of;
    request.weights = o.weights;
    const bool gpu_given = b.gpu.known() && b.gpu.source == Source::given;
    if (gpu_given) request.source.device = Device{Backend::cuda, 0};
    machine = data::machine_facts(request.source.device);
    if (gpu_given) {
        machine.gpu_free = b.gpu.bytes;
        machine.gpu_missing.clear();
    }
    if (b.ram.known()) {
        request.source.host_mem = b.ram.bytes;
        if (b.ram.source == Source::given) machine.host_available = b.ram.bytes;
    }
    return request;
}

// The members' sizes by dtype and their shares (the plan's, else the ones
// the weights ask for), then which stay in RAM under each dtype.
void size_members(MixReport& r, const std::vector<NamedData>& members, const std::vector<double>& weights,
                  const Budgets& b) {
    const auto weight = [&](std::size_t i) {
        return weights.empty() ? static_cast<double>(members[i].data.train) : weights.at(i);
    };
    double all = 0;
    for (std::size_t k = 0; k < members.size(); ++k) all += weight(k);
    r.dtypes = {DType::u8, DType::bf16, DType::f32};
    r.total.assign(r.dtypes.size(), 0);
    for (std::size_t i = 0; i < members.size(); ++i) {
        MixMemberSizes s;
        s.name = members[i].name;
        s.train = members[i].data.train;
        s.draws = r.plan_error.empty() ? r.plan.members[i].quota : 0;
        s.share = r.plan_error.empty() ? r.plan.members[i].share : all > 0 ? weight(i) / all : 0;
        for (std::size_t t = 0; t < r.dtypes.size(); ++t) {
            DataSpec d = with_dtype(members[i].data, r.dtypes[t]);
            d.test = 0;
            s.bytes.push_back(dataset_bytes(d));
            r.total[t] += s.bytes.back();
        }
        s.in_ram.assign(r.dtypes.size(), false);
        r.members.push_back(std::move(s));
    }
    for (std::size_t t = 0; t < r.dtypes.size(); ++t) {
        std::uint64_t used = 0;
        for (const std::size_t i : keep_order(r.members, t)) {
            MixMemberSizes& m = r.members[i];
            m.in_ram[t] = b.ram.known() && used + m.bytes[t] <= b.ram.bytes;
            if (m.in_ram[t]) used += m.bytes[t];
        }
    }
}

} // namespace

std::optional<MixReport> mix_report(const PlanOptions& o, const std::vector<NamedData>& members, const Budgets& b,
                                    const Rates& rates, double compute_rate, std::optional<std::uint64_t> model_bytes) {
    if (members.size() < 2) {
        if (!o.weights.empty()) throw usage_error("--weights needs several --dataset (a mix)");
        return std::nullopt;
    }
    if (!o.weights.empty() && o.weights.size() != members.size())
        throw usage_error("--weights gives " + std::to_string(o.weights.size()) + " weights for " +
                          std::to_string(members.size()) + " --dataset; give one per dataset, in their order");
    std::vector<std::unique_ptr<Dataset>> opened;
    std::vector<const Dataset*> datasets;
    for (const NamedData& m : members) {
        opened.push_back(std::make_unique<Dataset>(Dataset::open(m.name)));
        datasets.push_back(opened.back().get());
    }
    data::MachineFacts machine;
    const data::MixRequest request = mix_request(o, members.front().data, b, model_bytes, machine);
    MixReport r;
    try {
        r.plan = data::plan_mix(datasets, request, machine);
    } catch (const Error& e) {
        // The sizes stand without a data path (dsplan sizes datasets a mix
        // could not train yet, e.g. fewer samples than one --batch).
        r.plan_error = e.what();
    }
    r.ram_budget = b.ram.known() ? b.ram.bytes : 0;
    size_members(r, members, o.weights, b);
    Job job;
    job.batch = o.batch;
    job.prefetch = o.prefetch;
    if (r.plan_error.empty()) {
        r.first_epoch = mix_epoch(members, r.plan, job, rates, compute_rate, true);
        r.next_epochs = mix_epoch(members, r.plan, job, rates, compute_rate, false);
    }
    return r;
}

void print_mix_report(const MixReport& r) {
    std::printf("mix (%zu datasets; training splits; in RAM: kept under the RAM budget %s, drawn most per byte "
                "first)\n",
                r.members.size(), r.ram_budget ? format_bytes(r.ram_budget).c_str() : "unknown");
    std::printf("  %-24s %12s %7s", "dataset", "samples", "share");
    for (const DType t : r.dtypes) std::printf(" %16s", (std::string(dtype_name(t)) + " (in RAM)").c_str());
    std::printf("\n");
    for (const MixMemberSizes& m : r.members) {
        std::printf("  %-24s %12s %6.1f%%", m.name.c_str(), format_count(m.train).c_str(), 100.0 * m.share);
        for (std::size_t t = 0; t < r.dtypes.size(); ++t)
            std::printf(" %11s %4s", format_bytes(m.bytes[t]).c_str(), m.in_ram[t] ? "yes" : "no");
        std::printf("\n");
    }
    std::printf("  %-24s %12s %7s", "total", "", "");
    for (std::size_t t = 0; t < r.dtypes.size(); ++t) {
        std::size_t kept = 0;
        for (const MixMemberSizes& m : r.members) kept += m.in_ram[t];
        std::printf(" %11s %2zu/%zu", format_bytes(r.total[t]).c_str(), kept, r.members.size());
    }
    std::printf("\n");
    if (!r.plan_error.empty()) {
        std::printf("mix data path: not planned: %s\n", r.plan_error.c_str());
        return;
    }
    std::printf("mix data path (as dstrain builds it for these datasets, the RAM budget as --host-mem)\n");
    for (const std::string& line : data::describe_mix(r.plan)) std::printf("  %s\n", line.c_str());
    std::printf("mix epoch (%s draws)\n", format_count(r.plan.positions).c_str());
    std::printf("  first       %s\n", epoch_text(r.first_epoch).c_str());
    std::printf("  next        %s\n", epoch_text(r.next_epochs).c_str());
}

nlohmann::json mix_report_json(const MixReport& r) {
    nlohmann::json members = nlohmann::json::array();
    for (const MixMemberSizes& m : r.members) {
        nlohmann::json sizes = nlohmann::json::object(), in_ram = nlohmann::json::object();
        for (std::size_t t = 0; t < r.dtypes.size(); ++t) {
            sizes[std::string(dtype_name(r.dtypes[t]))] = m.bytes[t];
            in_ram[std::string(dtype_name(r.dtypes[t]))] = static_cast<bool>(m.in_ram[t]);
        }
        members.push_back({{"dataset", m.name},
                           {"train", m.train},
                           {"draws", m.draws},
                           {"share", m.share},
                           {"bytes", sizes},
                           {"in_ram", in_ram}});
    }
    nlohmann::json total = nlohmann::json::object();
    for (std::size_t t = 0; t < r.dtypes.size(); ++t) total[std::string(dtype_name(r.dtypes[t]))] = r.total[t];
    return {{"members", members},
            {"total_bytes", total},
            {"ram_budget", r.ram_budget},
            {"plan", r.plan_error.empty() ? data::mix_plan_json(r.plan) : nlohmann::json(nullptr)},
            {"plan_error", r.plan_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.plan_error)},
            {"first_epoch", r.plan_error.empty() ? epoch_json(r.first_epoch) : nlohmann::json(nullptr)},
            {"next_epochs", r.plan_error.empty() ? epoch_json(r.next_epochs) : nlohmann::json(nullptr)}};
}

} // namespace dstk::plan
