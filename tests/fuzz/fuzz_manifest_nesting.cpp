// libFuzzer target: a dataset.json nested deeply somewhere. The input's first
// byte picks a place in a valid manifest, the others describe a JSON value
// put there, a byte a step (open an array, open an object, a number, a
// string, close). parse_json must refuse exactly the documents nested more
// than json_max_depth levels; parse_manifest must refuse those with
// dstk::Error naming the nesting, never run out of stack (libFuzzer feeds
// inputs of 64 KiB: 64K levels), and round-trip whatever it accepts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/error.hpp"
#include "dstk/json.hpp"
#include "dstk/manifest.hpp"

namespace {

// A valid manifest with "@V@" where the value goes, and the number of
// arrays and objects around that place.
struct Place {
    const char* text;
    int depth;
};
const Place places[] = {
    {R"({"format_version":1,"splits":[{"name":"train","samples":2,"fields":[{"name":"x","dtype":"u8","shape":[2],)"
     R"("storage":"npy","file":"train_x.npy","bytes":132}]}],"provenance":{"tool":"t","params":{"v":@V@}}})",
     3},
    {R"({"format_version":1,"extra":@V@,"splits":[{"name":"train","samples":2,"fields":[{"name":"x","dtype":"u8",)"
     R"("shape":[2],"storage":"npy","file":"train_x.npy","bytes":132}]}]})",
     1},
    {R"({"format_version":1,"splits":[{"name":"train","samples":2,"fields":[{"name":"x","dtype":"u8","shape":[2],)"
     R"("storage":"npy","file":"train_x.npy","bytes":132,"extra":@V@}]}]})",
     5},
    {R"({"format_version":1,"splits":[{"name":"train","samples":2,"fields":[{"name":"x","dtype":"u8","shape":[2],)"
     R"("storage":"npy","file":"train_x.npy","bytes":132}]}],"stats":{"mean":[1],"std":@V@}})",
     2},
    {R"({"format_version":1,"splits":[{"name":"train","samples":2,"fields":[{"name":"x","dtype":"u8","shape":@V@,)"
     R"("storage":"npy","file":"train_x.npy","bytes":132}]}]})",
     5},
};

// The value the bytes describe, always one array at its root; `depth` gets
// its deepest nesting (the root counts 1).
std::string value_of(const std::uint8_t* data, std::size_t size, int& depth) {
    std::string out = "[";
    std::vector<char> open{'['};
    std::vector<bool> empty{true};
    depth = 1;
    auto next_value = [&] {
        if (!empty.back()) out += ',';
        empty.back() = false;
        if (open.back() == '{') out += "\"k\":";
    };
    for (std::size_t i = 0; i < size; ++i) {
        switch (data[i] % 5) {
        case 0:
        case 1:
            next_value();
            open.push_back(data[i] % 5 == 0 ? '[' : '{');
            empty.push_back(true);
            out += open.back();
            depth = std::max(depth, static_cast<int>(open.size()));
            break;
        case 2:
            next_value();
            out += std::to_string(data[i]);
            break;
        case 3:
            next_value();
            out += "\"s\"";
            break;
        default:
            if (open.size() > 1) {
                out += open.back() == '[' ? ']' : '}';
                open.pop_back();
                empty.pop_back();
            }
        }
    }
    while (!open.empty()) {
        out += open.back() == '[' ? ']' : '}';
        open.pop_back();
    }
    return out;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const Place& place = places[data[0] % (sizeof places / sizeof places[0])];
    int depth = 0;
    const std::string value = value_of(data + 1, size - 1, depth);
    std::string text = place.text;
    text.replace(text.find("@V@"), 3, value);
    const bool too_deep = place.depth + depth > dstk::json_max_depth;

    bool refused = false;
    try {
        const nlohmann::json doc = dstk::parse_json(text);
        // What was read prints and reads back the same.
        if (dstk::parse_json(dstk::dump_json(doc, -1, "fuzz")) != doc) __builtin_trap();
    } catch (const dstk::JsonDepthError&) {
        refused = true;
    }
    if (refused != too_deep) __builtin_trap();

    try {
        const dstk::Manifest m = dstk::parse_manifest(text, "fuzz.json");
        if (too_deep) __builtin_trap();
        const dstk::Manifest again = dstk::parse_manifest(dstk::serialize_manifest(m), "again.json");
        if (again.splits.size() != m.splits.size() || again.provenance.params != m.provenance.params) __builtin_trap();
    } catch (const dstk::Error& e) {
        if (too_deep && std::string_view(e.what()).find("nested more than") == std::string_view::npos) __builtin_trap();
    }
    return 0;
}
