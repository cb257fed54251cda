// The names of the data path's enums, the limiting stage, and the one factory
// of batch sources: the plan's placement and backend pick one of the sources
// of host_sources.cpp, device_sources.cpp and device_stream.cpp.
#include "dstk/data/batch_source.hpp"

#include <stdexcept>
#include <string>

#include "dstk/data/source_plan.hpp"
#include "dstk/enum_names.hpp"
#include "source_parts.hpp"

namespace dstk::data {

constexpr EnumNames<Placement, 4> placement_names{{{{Placement::automatic, "auto"},
                                                    {Placement::device, "device"},
                                                    {Placement::stream, "stream"},
                                                    {Placement::managed, "managed"}}}};

constexpr EnumNames<ManagedPolicy, 3> managed_policy_names{
    {{{ManagedPolicy::prefetch, "prefetch"}, {ManagedPolicy::advise, "advise"}, {ManagedPolicy::fault, "fault"}}}};

Placement parse_placement(std::string_view text, std::string_view setting) {
    return placement_names.parse(text, setting);
}

std::string_view placement_name(Placement p) {
    return placement_names.name(p);
}

ManagedPolicy parse_managed_policy(std::string_view text, std::string_view setting) {
    return managed_policy_names.parse(text, setting);
}

std::string_view managed_policy_name(ManagedPolicy p) {
    return managed_policy_names.name(p);
}

std::string_view stage_name(Stage s) {
    static constexpr EnumNames<Stage, 4> names{{{{Stage::compute, "compute"},
                                                 {Stage::read, "read (disk)"},
                                                 {Stage::decode, "decode (zstd)"},
                                                 {Stage::h2d, "h2d (host to device)"}}}};
    return names.name(s);
}

std::string_view limiting_stage(const StageTimes& t) {
    const double loop = t.read_wait + t.compute;
    if (loop <= 0 || t.read_wait < 0.1 * loop) return stage_name(Stage::compute);
    if (t.decode > t.read && t.decode >= t.h2d) return stage_name(Stage::decode);
    if (t.h2d > t.read) return stage_name(Stage::h2d);
    return stage_name(Stage::read);
}

std::unique_ptr<BatchSource> make_batch_source(const Dataset& ds, const SourcePlan& plan) {
    const SplitInfo& split = ds.manifest().split(plan.split);
    const SourceFields f(split, source_fields(ds.manifest(), split, plan.config));
    const SourceConfig& c = plan.config;
    const bool cuda = c.device.backend == Backend::cuda;
    switch (c.placement) {
    case Placement::stream:
        return cuda ? device_stream_source(ds, f, c) : host_stream_source(ds, f, c);
    case Placement::device:
        return cuda ? device_resident_source(ds, f, c) : host_resident_source(ds, f, c);
    case Placement::managed:
        if (!cuda) throw std::logic_error("make_batch_source: managed memory planned for the cpu backend");
        return managed_source(ds, f, c);
    case Placement::automatic:
        break;
    }
    throw std::logic_error("make_batch_source: the plan left the placement automatic");
}

} // namespace dstk::data
