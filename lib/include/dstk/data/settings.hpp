#pragma once
// The data path's messages name its settings (prefetch, readers, host_mem,
// direct, ...), never a tool's flags: each caller says how it spells them.
// dstrain maps "prefetch" to "--prefetch" and "placement" to "--data", the
// Python loader to its keyword arguments ("prefetch="); without a mapping a
// message says the setting's own name.
#include <functional>
#include <string>
#include <string_view>

namespace dstk::data {

// The settings' names, as SourceRequest (source_plan.hpp) and the Python
// loader's arguments call them: fields, placement, device, order, seed,
// window, chunk, batch, prefetch, readers, direct, host_mem, managed_policy,
// oversubscribe, bench.
using SettingNames = std::function<std::string(std::string_view setting)>;

// `setting` as `names` spells it (the setting itself without names).
inline std::string spell(const SettingNames& names, std::string_view setting) {
    return names ? names(setting) : std::string(setting);
}

} // namespace dstk::data
