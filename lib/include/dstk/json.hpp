#pragma once
// JSON in and out of dstk. Every reader parses with parse_json and every
// writer prints with dump_json: documents are nested at most json_max_depth
// levels (a deeper one is refused with a message, never recursed into until
// the stack runs out), and text that is not UTF-8 is named as such.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dstk {

inline constexpr int json_max_depth = 64; // arrays and objects inside each other

// Thrown by parse_json for a document nested deeper than json_max_depth: a
// nlohmann::json::exception like those of malformed JSON, so that each
// reader's handler for "not valid JSON" phrases it with its file and fix.
class JsonDepthError : public nlohmann::json::exception {
  public:
    explicit JsonDepthError(const std::string& what) : exception(0, what.c_str()) {}
};

// Parses `text` (malformed JSON: nlohmann::json::parse_error; too deep: JsonDepthError).
nlohmann::json parse_json(std::string_view text);
// Prints `j` (indent < 0: one line). Throws runtime_error naming `what` (the
// file or document) when it is nested too deep or holds text that is not UTF-8.
std::string dump_json(const nlohmann::json& j, int indent, const std::string& what);

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_utf8(std::string_view s);
// `s` for a message: printable ASCII as is, every other byte as \xHH.
std::string escape_bytes(std::string_view s);

} // namespace dstk
