// plan_mix: each member of a mix placed once, within one host budget
// (mix_plan.hpp states the rule); each member's source planned by
// plan_source, whose rules it does not repeat.
#include "dstk/data/mix_plan.hpp"
#include "dstk/data/mix_source.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include <nlohmann/json.hpp>

#include "dstk/bench/results.hpp"
#include "dstk/channel_stats.hpp"
#include "dstk/checksum.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/units.hpp"
#include "source_fields.hpp"

namespace dstk::data {
namespace {

constexpr EnumNames<MixPlacement, 4> mix_placement_names{{{{MixPlacement::automatic, "auto"},
                                                           {MixPlacement::device, "device"},
                                                           {MixPlacement::host, "host"},
                                                           {MixPlacement::stream, "stream"}}}};

std::string member_name(std::size_t i, const Dataset& ds) {
    return "member " + std::to_string(i) + " (" + ds.dir().string() + ")";
}

bool is_mix_field(std::string_view f) {
    return f == dataset_field || f == index_field;
}

// The request's fields less the mix's own, and those it asked for.
std::vector<std::string> stored_fields(const std::vector<std::string>& fields, std::vector<std::string>& added) {
    std::vector<std::string> out;
    for (const std::string& f : fields) (is_mix_field(f) ? added : out).push_back(f);
    return out;
}

void check_counts(const std::vector<const Dataset*>& members, const MixRequest& r) {
    const auto name = [&](std::string_view s) { return spell(r.source.names, s); };
    if (members.empty()) throw usage_error("a mix needs at least one dataset (none given); name the datasets to mix");
    const std::string n = std::to_string(members.size());
    if (!r.weights.empty() && r.weights.size() != members.size())
        throw usage_error(name("weights") + " lists " + std::to_string(r.weights.size()) + " weights for " + n +
                          " datasets (one weight per dataset, in their order); give " + n + " weights");
    if (r.placements.size() > 1 && r.placements.size() != members.size())
        throw usage_error(name("placement") + " lists " + std::to_string(r.placements.size()) + " placements for " + n +
                          " datasets (one for all, or one per dataset in their order); give 1 or " + n);
}

// The stored fields every member delivers, resolved on the first member
// (its roles where none are named); the others must hold them alike.
std::vector<std::string> resolve_fields(const std::vector<const Dataset*>& members, const MixRequest& r,
                                        const std::vector<std::string>& added, std::vector<std::string> fields) {
    const auto name = [&](std::string_view s) { return spell(r.source.names, s); };
    SourceConfig c;
    c.fields = std::move(fields);
    c.names = r.source.names;
    const Manifest& first = members[0]->manifest();
    std::vector<std::string> names;
    std::vector<const FieldInfo*> ref = source_fields(first, first.split(r.source.split), c);
    for (const FieldInfo* f : ref) names.push_back(f->name);
    for (std::size_t i = 0; i < members.size(); ++i) {
        const SplitInfo& split = members[i]->manifest().split(r.source.split);
        for (const std::string& a : added)
            if (split.find(a))
                throw usage_error(member_name(i, *members[i]) + " has its own field '" + a +
                                  "' (the mix adds one of that name: each sample's member or row); rename the " +
                                  "field with dsconvert, or leave '" + a + "' out of " + name("fields"));
        for (const FieldInfo* want : ref) {
            const FieldInfo* f = split.find(want->name);
            if (!f)
                throw usage_error(member_name(i, *members[i]) + " has no field '" + want->name + "' in split '" +
                                  split.name + "' (every member of a mix delivers the same fields); name fields " +
                                  "that every member holds in " + name("fields") + ", or leave this member out");
            if (f->dtype != want->dtype || f->shape != want->shape)
                throw usage_error(member_name(i, *members[i]) + " holds field '" + want->name + "' as " +
                                  std::string(dtype_name(f->dtype)) + "[" + f->shape.str() + "] but " +
                                  member_name(0, *members[0]) + " as " + std::string(dtype_name(want->dtype)) + "[" +
                                  want->shape.str() + "] (a batch holds one dtype and shape per field); convert " +
                                  "the member with dsconvert --dtype, or leave the field out");
        }
    }
    return names;
}

struct Room {
    std::uint64_t device = 0; // the device room left
    std::uint64_t budget = 0; // the host budget
    std::string device_where; // what the device room is, in words
};

Room room_of(const MixRequest& r, const MachineFacts& m) {
    Room room;
    if (r.source.device.backend == Backend::cuda) {
        const std::uint64_t free90 = m.gpu_free.value_or(0) / 10 * 9;
        room.device = free90 > r.source.reserved_device_bytes ? free90 - r.source.reserved_device_bytes : 0;
        room.device_where = "90% of free GPU memory less the model";
    } else {
        room.device = m.host_available / 2;
        room.device_where = "half of available RAM";
    }
    room.budget = r.source.host_mem ? r.source.host_mem : m.host_available / 2;
    return room;
}

// The member's source, placed: device as plan_source plans it; host and
// stream as a stream source (its window cache as plan_source sizes it for
// this machine), host without O_DIRECT and keeping its pages, stream with
// O_DIRECT unless the request says otherwise (the budget does not keep it).
SourcePlan member_source(const Dataset& ds, const SourceRequest& base, const MachineFacts& m, MixPlacement where) {
    SourceRequest r = base;
    r.slice = {};
    r.drop_last = false;
    r.host_mem = 0;
    r.hash_batches = false; // the mix hashes its own batches
    r.placement = where == MixPlacement::device ? Placement::device : Placement::stream;
    if (where == MixPlacement::host) r.direct = false;
    if (where == MixPlacement::stream) r.direct = base.direct.value_or(true);
    SourcePlan p = plan_source(ds, r, m);
    if (where == MixPlacement::host) {
        p.host.drop_pages = p.config.host.drop_pages = false;
        p.direct_why = "kept in the page cache (placed in host memory)";
    } else if (where == MixPlacement::stream && !base.direct) {
        p.direct_why = "reading with O_DIRECT: the mix's host budget does not keep this member; " +
                       spell(base.names, "direct") + " off reads through the page cache";
    }
    return p;
}

std::uint64_t member_bytes(const Dataset& ds, const SourceRequest& r) {
    SourceConfig c;
    c.fields = r.fields;
    const SplitInfo& split = ds.manifest().split(r.split);
    return checked_mul(split.samples, SourceFields(split, source_fields(ds.manifest(), split, c)).row_bytes(),
                       "split bytes");
}

// The placements, by the rule of mix_plan.hpp.
void place_members(const std::vector<const Dataset*>& members, const MixRequest& r, const MachineFacts& m,
                   const std::vector<std::uint64_t>& bytes, MixPlan& plan) {
    const auto name = [&](std::string_view s) { return spell(r.source.names, s); };
    Room room = room_of(r, m);
    plan.host_budget = room.budget;
    const std::size_t n = members.size();
    std::vector<std::size_t> by_rate(n);
    std::iota(by_rate.begin(), by_rate.end(), 0);
    std::stable_sort(by_rate.begin(), by_rate.end(), [&](std::size_t a, std::size_t b) {
        // share_a / bytes_a > share_b / bytes_b, without division
        return static_cast<long double>(plan.members[a].quota) * bytes[b] >
               static_cast<long double>(plan.members[b].quota) * bytes[a];
    });
    const auto given = [&](std::size_t i) {
        return r.placements.empty() ? MixPlacement::automatic : r.placements[r.placements.size() == 1 ? 0 : i];
    };
    // Devices first (given ones, then the automatic ones by rate).
    for (int pass = 0; pass < 2; ++pass)
        for (std::size_t i : by_rate) {
            MixMemberPlan& mp = plan.members[i];
            const MixPlacement g = given(i);
            if (pass == 0 && g == MixPlacement::device) {
                mp.placement = MixPlacement::device;
                mp.why = name("placement") + " device";
            } else if (pass == 1 && g == MixPlacement::automatic && bytes[i] <= room.device) {
                mp.placement = MixPlacement::device;
                mp.why = format_bytes(bytes[i]) + " fit in the device room left (" + format_bytes(room.device) +
                         " of " + room.device_where + ")";
            } else {
                continue;
            }
            room.device -= std::min(room.device, bytes[i]);
            mp.source = member_source(*members[i], r.source, m, MixPlacement::device);
        }
    // Every other member streams; its own memory first.
    std::vector<std::size_t> streamed;
    for (std::size_t i : by_rate)
        if (plan.members[i].placement != MixPlacement::device) streamed.push_back(i);
    // On the cpu backend the mix's staging and slot are host memory too.
    std::uint64_t used = r.source.device.backend == Backend::cpu ? plan.mix_bytes : 0;
    for (const MixMemberPlan& mp : plan.members)
        if (mp.placement == MixPlacement::device) used += mp.source.host_bytes;
    for (std::size_t i : streamed) {
        plan.members[i].source = member_source(*members[i], r.source, m, MixPlacement::stream);
        used += plan.members[i].source.host_bytes;
    }
    if (used > room.budget)
        throw no_fit_error("the mix needs " + format_bytes(used) + " of host memory for its sources (rings, window " +
                           "caches, resident members, the mix's staging) but " + name("host_mem") + " is " +
                           format_bytes(room.budget) + (r.source.host_mem ? "" : " (half of the memory available)") +
                           "; raise " + name("host_mem") + ", or lower " + name("batch") + ", " + name("prefetch") +
                           " or " + name("window"));
    for (std::size_t i : streamed) {
        MixMemberPlan& mp = plan.members[i];
        const MixPlacement g = given(i);
        const bool fits = used + bytes[i] <= room.budget;
        if (g == MixPlacement::host || (g == MixPlacement::automatic && fits)) {
            mp.placement = MixPlacement::host;
            mp.why = g == MixPlacement::host ? name("placement") + " host"
                                             : format_bytes(bytes[i]) + " fit in the host budget left (" +
                                                   format_bytes(room.budget - used) + " of " + name("host_mem") + " " +
                                                   format_bytes(room.budget) + ")";
            used += bytes[i];
            mp.source = member_source(*members[i], r.source, m, MixPlacement::host);
        } else {
            mp.placement = MixPlacement::stream;
            mp.why = g == MixPlacement::stream ? name("placement") + " stream"
                                               : format_bytes(bytes[i]) + " exceed the host budget left (" +
                                                     format_bytes(room.budget > used ? room.budget - used : 0) +
                                                     "): read from disk every epoch";
        }
    }
}

void add_read_rates(const MixRequest& r, MixPlan& plan) {
    if (r.source.bench.empty()) return;
    const std::optional<double> rate = bench::sequential_read_rate(bench::load_results(r.source.bench));
    for (MixMemberPlan& mp : plan.members)
        if (mp.placement != MixPlacement::device) mp.read_rate = rate;
}

// The mix's batch fields: the stored ones (member 0's, all alike) and the
// mix's own, in the order asked (the roles where none were named).
std::vector<BatchField> mix_fields(const Dataset& first, const SourceRequest& base,
                                   const std::vector<std::string>& asked) {
    SourceConfig c;
    c.fields = base.fields;
    const SplitInfo& split = first.manifest().split(base.split);
    const std::vector<BatchField> stored =
        SourceFields(split, source_fields(first.manifest(), split, c)).batch().fields;
    std::vector<BatchField> out;
    std::size_t next = 0;
    for (const std::string& f : asked) {
        if (f == dataset_field)
            out.push_back({f, DType::i32, Shape{}, nullptr});
        else if (f == index_field)
            out.push_back({f, DType::i64, Shape{}, nullptr});
        else
            out.push_back(stored.at(next++));
    }
    for (; next < stored.size(); ++next) out.push_back(stored[next]); // the roles
    return out;
}

} // namespace

MixPlacement parse_mix_placement(std::string_view text, std::string_view setting) {
    return mix_placement_names.parse(text, setting);
}

std::string_view mix_placement_name(MixPlacement p) {
    return mix_placement_names.name(p);
}

std::vector<MixMember> MixPlan::order_members() const {
    std::vector<MixMember> out;
    for (const MixMemberPlan& m : members) out.push_back({m.dataset.string(), m.key, m.source.samples, m.weight});
    return out;
}

std::uint64_t mix_member_key(const Dataset& ds) {
    Xxh64 h;
    for (const SplitInfo& s : ds.manifest().splits) {
        h.update(s.name.data(), s.name.size() + 1);
        h.update(&s.samples, sizeof s.samples);
        for (const FieldInfo& f : s.fields) {
            h.update(f.name.data(), f.name.size() + 1);
            h.update(f.checksum.data(), f.checksum.size() + 1);
            for (const FieldPart& p : f.parts) h.update(p.checksum.data(), p.checksum.size() + 1);
        }
    }
    return h.digest();
}

MixPlan plan_mix(const std::vector<const Dataset*>& members, const MixRequest& r, const MachineFacts& m) {
    check_counts(members, r);
    std::vector<std::string> added;
    SourceRequest base = r.source;
    base.fields = resolve_fields(members, r, added, stored_fields(r.source.fields, added));
    MixRequest mr = r;
    mr.source = base;
    MixPlan plan;
    plan.batch = r.source.batch;
    plan.slice = r.source.slice;
    plan.drop_last = r.source.drop_last;
    plan.seed = r.source.seed;
    plan.hash_batches = r.source.hash_batches;
    std::vector<std::uint64_t> bytes;
    for (std::size_t i = 0; i < members.size(); ++i) {
        MixMemberPlan mp;
        mp.dataset = members[i]->dir();
        mp.key = mix_member_key(*members[i]);
        const std::uint64_t samples = members[i]->manifest().split(base.split).samples;
        mp.weight = r.weights.empty() ? static_cast<double>(samples) : r.weights[i];
        mp.source.samples = samples;
        plan.members.push_back(std::move(mp));
        bytes.push_back(member_bytes(*members[i], base));
    }
    const std::vector<std::uint64_t> quotas = mix_quotas(plan.order_members());
    plan.positions = std::accumulate(quotas.begin(), quotas.end(), std::uint64_t{0});
    for (std::size_t i = 0; i < members.size(); ++i) {
        plan.members[i].quota = quotas[i];
        plan.members[i].share = static_cast<double>(quotas[i]) / static_cast<double>(plan.positions);
    }
    if (r.source.drop_last && std::uint64_t{r.source.batch} * r.source.slice.world > plan.positions)
        throw usage_error(spell(r.source.names, "batch") + " " + std::to_string(r.source.batch) +
                          " is larger than the mix's epoch (" + format_count(plan.positions) +
                          " samples); use a smaller " + spell(r.source.names, "batch"));
    plan.batches = r.source.slice.batches(plan.positions, r.source.batch, r.source.drop_last);
    plan.fields = mix_fields(*members[0], base, r.source.fields.empty() ? base.fields : r.source.fields);
    plan.mix_bytes = mix_source_bytes(plan, r.source.device);
    place_members(members, mr, m, bytes, plan);
    add_read_rates(r, plan);
    for (std::size_t i = 0; i < members.size(); ++i) {
        MixMemberPlan& mp = plan.members[i];
        mp.host_bytes = mp.source.host_bytes + (mp.placement == MixPlacement::host ? bytes[i] : 0);
        plan.host_bytes += mp.host_bytes;
        plan.device_bytes += mp.source.device_bytes;
    }
    plan.device_bytes += plan.mix_bytes;
    if (r.source.device.backend == Backend::cpu) plan.host_bytes += plan.mix_bytes;
    return plan;
}

ChannelNorm mix_field_norm(const std::vector<const Dataset*>& members, const std::vector<std::uint64_t>& draws,
                           const std::string& field) {
    std::vector<ChannelStats> stats;
    ChannelNorm out;
    for (std::size_t i = 0; i < members.size(); ++i) {
        if (field == dataset_field || field == index_field) {
            const double n = static_cast<double>(members[i]->manifest().split("train").samples);
            if (field == dataset_field)
                stats.push_back({{static_cast<double>(i)}, {0.0}});
            else
                stats.push_back({{(n - 1) / 2}, {std::sqrt((n * n - 1) / 12)}});
            continue;
        }
        if (!members[i]->manifest().split("train").find(field))
            throw usage_error(member_name(i, *members[i]) + " has no field '" + field +
                              "' in split 'train' (every member of a mix delivers the same fields); name a field "
                              "that every member holds, or leave this member out");
        const ChannelNorm n = field_norm(*members[i], field, "train");
        out.per_channel = n.per_channel;
        stats.push_back(
            {std::vector<double>(n.mean.begin(), n.mean.end()), std::vector<double>(n.std.begin(), n.std.end())});
    }
    const ChannelStats all = combine_stats(stats, draws);
    out.mean.assign(all.mean.begin(), all.mean.end());
    out.std.assign(all.std.begin(), all.std.end());
    out.source = "each member's, weighted by its draws per epoch";
    return out;
}

std::vector<std::string> describe_mix(const MixPlan& p) {
    std::vector<std::string> lines;
    for (std::size_t i = 0; i < p.members.size(); ++i) {
        const MixMemberPlan& m = p.members[i];
        const SourcePlan& s = m.source;
        char share[32];
        std::snprintf(share, sizeof share, "%.1f%%", 100.0 * m.share);
        std::string line = "mix: " + std::to_string(i) + " " + m.dataset.string() + " (" + format_count(s.samples) +
                           " samples, " + share + " of draws): " + std::string(mix_placement_name(m.placement)) +
                           ", host " + format_bytes(m.host_bytes) + ", " +
                           (s.config.device.backend == Backend::cuda ? "GPU " : "batches ") +
                           format_bytes(s.device_bytes);
        if (m.placement == MixPlacement::device)
            line += ", read from memory";
        else if (m.read_rate)
            line += ", disk " + format_rate(*m.read_rate) +
                    (m.placement == MixPlacement::host ? " (first epoch; then memory)" : "");
        else
            line += m.placement == MixPlacement::host
                        ? ", disk in the first epoch, then memory"
                        : ", disk every epoch" + std::string(s.config.direct ? " (O_DIRECT)" : "");
        lines.push_back(line + " (" + m.why + ")");
    }
    lines.push_back("mix: " + format_count(p.positions) + " samples per epoch, " + format_count(p.batches) +
                    " batches of " + std::to_string(p.batch) + "; host ceiling " + format_bytes(p.host_bytes) +
                    " of a budget of " + format_bytes(p.host_budget) + ", " +
                    (p.members[0].source.config.device.backend == Backend::cuda ? "GPU " : "batches ") +
                    format_bytes(p.device_bytes) + " (mix staging and slot " + format_bytes(p.mix_bytes) + ")");
    return lines;
}

nlohmann::json mix_plan_json(const MixPlan& p) {
    nlohmann::json members = nlohmann::json::array();
    for (const MixMemberPlan& m : p.members) {
        nlohmann::json j = {{"dataset", m.dataset.string()},
                            {"key", m.key},
                            {"weight", m.weight},
                            {"quota", m.quota},
                            {"share", m.share},
                            {"placement", mix_placement_name(m.placement)},
                            {"placement_why", m.why},
                            {"host_bytes", m.host_bytes},
                            {"device_bytes", m.source.device_bytes},
                            {"read_rate", m.read_rate ? nlohmann::json(*m.read_rate) : nlohmann::json(nullptr)},
                            {"source", plan_json(m.source)}};
        members.push_back(std::move(j));
    }
    nlohmann::json fields = nlohmann::json::array();
    for (const BatchField& f : p.fields)
        fields.push_back({{"name", f.name}, {"dtype", dtype_name(f.dtype)}, {"shape", f.shape.dims}});
    return {{"members", members},
            {"fields", fields},
            {"batch", p.batch},
            {"seed", p.seed},
            {"samples_per_epoch", p.positions},
            {"batches_per_epoch", p.batches},
            {"host_budget", p.host_budget},
            {"host_bytes", p.host_bytes},
            {"device_bytes", p.device_bytes},
            {"mix_bytes", p.mix_bytes}};
}

} // namespace dstk::data
