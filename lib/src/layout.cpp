#include "dstk/layout.hpp"

#include <cstdio>
#include <string>

#include "dstk/enum_names.hpp"

namespace dstk {

constexpr EnumNames<Layout, 2> layout_names{
    {{{Layout::sample_major, "sample-major"}, {Layout::feature_major, "feature-major"}}}};

Layout parse_layout(std::string_view text, std::string_view option) {
    // dsgen spelled them "sample" and "feature" before both tools shared one enum.
    for (const auto& [value, name] : layout_names.entries)
        if (text.size() + 6 == name.size() && name.substr(0, text.size()) == text) {
            std::fprintf(stderr, "note: %.*s %.*s is deprecated; write %.*s %.*s\n", static_cast<int>(option.size()),
                         option.data(), static_cast<int>(text.size()), text.data(), static_cast<int>(option.size()),
                         option.data(), static_cast<int>(name.size()), name.data());
            return value;
        }
    return layout_names.parse(text, option);
}

std::string_view layout_name(Layout layout) {
    return layout_names.name(layout);
}

} // namespace dstk
