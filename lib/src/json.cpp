#include "dstk/json.hpp"

#include <cstdio>
#include <utility>
#include <vector>

#include "dstk/error.hpp"

namespace dstk {
namespace {

const std::string depth_message =
    "arrays or objects nested more than " + std::to_string(json_max_depth) + " deep, the most dstk reads";

// The deepest nesting of `j`, walked without recursion.
int depth_of(const nlohmann::json& j) {
    int deepest = 0;
    std::vector<std::pair<const nlohmann::json*, int>> pending{{&j, 0}};
    while (!pending.empty()) {
        const auto [v, d] = pending.back();
        pending.pop_back();
        if (!v->is_structured()) continue;
        deepest = std::max(deepest, d + 1);
        if (deepest > json_max_depth) return deepest; // deep enough to refuse
        for (const auto& child : *v) pending.emplace_back(&child, d + 1);
    }
    return deepest;
}

} // namespace

nlohmann::json parse_json(std::string_view text) {
    // The callback sees each array and object start with the number of
    // containers around it; the parser itself keeps its stack on the heap.
    const nlohmann::json::parser_callback_t limit = [](int depth, nlohmann::json::parse_event_t event,
                                                       nlohmann::json&) {
        if ((event == nlohmann::json::parse_event_t::object_start ||
             event == nlohmann::json::parse_event_t::array_start) &&
            depth >= json_max_depth)
            throw JsonDepthError(depth_message);
        return true;
    };
    return nlohmann::json::parse(text.begin(), text.end(), limit);
}

std::string dump_json(const nlohmann::json& j, int indent, const std::string& what) {
    if (depth_of(j) > json_max_depth) throw runtime_error("cannot write " + what + " (" + depth_message + ")");
    try {
        return j.dump(indent);
    } catch (const nlohmann::json::type_error& e) { // 316: a string that is not UTF-8
        throw runtime_error("cannot write " + what + " (it would hold text that is not valid UTF-8: " +
                            std::string(e.what()) + "); use UTF-8 names for files, fields and arrays");
    }
}

bool is_utf8(std::string_view s) {
    std::size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            ++i;
            continue;
        }
        std::size_t n = 0;
        unsigned cp = 0;
        if (c >= 0xC2 && c <= 0xDF)
            n = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, cp = c & 0x07;
        else
            return false; // a continuation byte first, an overlong lead (C0, C1) or past F4
        if (s.size() - i <= n) return false;
        for (std::size_t k = 1; k <= n; ++k) {
            const auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

std::string escape_bytes(std::string_view s) {
    std::string out;
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out += ch;
            continue;
        }
        char buf[5];
        std::snprintf(buf, sizeof buf, "\\x%02X", c);
        out += buf;
    }
    return out;
}

} // namespace dstk
