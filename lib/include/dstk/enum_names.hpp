#pragma once
// One table per enum gives both directions, text -> value for options and
// value -> text for output, so a new enumerator is added in one place:
//
//   constexpr EnumNames<Order, 3> order_names{{{Order::sequential, "sequential"},
//                                              {Order::chunk, "chunk"}, {Order::full, "full"}}};
//   Order parse_order(std::string_view t) { return order_names.parse(t, "--order"); }
//   std::string_view order_name(Order o) { return order_names.name(o); }
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "dstk/error.hpp"

namespace dstk {

template <typename E, std::size_t N> struct EnumNames {
    std::array<std::pair<E, std::string_view>, N> entries;

    // The value spelt `text`, if any (for readers with errors of their own).
    std::optional<E> find(std::string_view text) const {
        for (const auto& [value, name] : entries)
            if (name == text) return value;
        return std::nullopt;
    }
    // Usage error naming the option and every accepted spelling otherwise.
    E parse(std::string_view text, std::string_view option) const {
        if (const auto value = find(text)) return *value;
        throw usage_error("invalid " + std::string(option) + " '" + std::string(text) + "' (expected " + choices() +
                          ")");
    }
    std::string_view name(E value) const {
        for (const auto& [v, name] : entries)
            if (v == value) return name;
        return "?";
    }
    // "a, b or c": for messages and help texts.
    std::string choices() const {
        std::string out;
        for (std::size_t i = 0; i < N; ++i) {
            if (i > 0) out += i + 1 == N ? " or " : ", ";
            out += entries[i].second;
        }
        return out;
    }
};

} // namespace dstk
