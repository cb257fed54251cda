#include "dstk/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "dstk/error.hpp"

namespace dstk {
namespace {

std::string quoted(std::string_view s) {
    return "'" + std::string(s) + "'";
}

struct Number {
    long double value;
    std::string_view suffix;
};

Number split_number(std::string_view text, std::string_view what) {
    std::size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
    const std::string digits(text.substr(0, i));
    if (digits.empty() || digits == "." || digits.find('.') != digits.rfind('.'))
        throw usage_error("invalid " + std::string(what) + " " + quoted(text) +
                          " (expected a non-negative number with an optional unit, e.g. 10G or 1.5M)");
    std::string_view suffix = text.substr(i);
    while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
    return {std::stold(digits), suffix};
}

std::uint64_t to_u64(long double v, std::string_view text, std::string_view what) {
    const long double r = std::roundl(v);
    if (!(r < 18446744073709551616.0L))
        throw usage_error(std::string(what) + " " + quoted(text) + " is too large (over 2^64 - 1)");
    return static_cast<std::uint64_t>(r);
}

} // namespace

std::uint64_t parse_size(std::string_view text, std::string_view what) {
    if (!text.empty() && text.front() == '-')
        throw usage_error("invalid " + std::string(what) + " " + quoted(text) + " (sizes cannot be negative)");
    const auto [value, suffix] = split_number(text, what);
    std::string s(suffix);
    long double mult = 1;
    if (s.empty() || s == "B" || s == "b") {
        mult = 1;
    } else {
        const char p = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
        const std::string rest = s.substr(1);
        int power = 0;
        switch (p) {
        case 'K':
            power = 1;
            break;
        case 'M':
            power = 2;
            break;
        case 'G':
            power = 3;
            break;
        case 'T':
            power = 4;
            break;
        case 'P':
            power = 5;
            break;
        default:
            power = -1;
        }
        long double base = 0;
        if (rest.empty() || rest == "iB" || rest == "ib" || rest == "IB")
            base = 1024;
        else if (rest == "B" || rest == "b")
            base = 1000;
        if (power < 0 || base == 0)
            throw usage_error("invalid " + std::string(what) + " " + quoted(text) + " (unknown unit '" + s +
                              "'; use K M G T, KiB MiB GiB TiB (powers of 1024) "
                              "or KB MB GB TB (powers of 1000))");
        mult = std::pow(base, static_cast<long double>(power));
    }
    return to_u64(value * mult, text, what);
}

std::uint64_t parse_memory_size(std::string_view text, std::string_view what) {
    const std::uint64_t v = parse_size(text, what);
    // A bare number is bytes; nobody plans RAM, disk or GPU memory below
    // 1 MiB, so "--ram 128" is a forgotten unit, not a budget of 128 bytes.
    const bool unit_given = !text.empty() && std::isalpha(static_cast<unsigned char>(text.back()));
    if (!unit_given && v > 0 && v < (1ull << 20))
        throw usage_error("invalid " + std::string(what) + " " + quoted(text) +
                          " (a size without a unit is bytes, and " + std::string(text) +
                          " B is below 1 MiB); did you mean " + std::string(text) + "G? Give a unit: K M G T");
    return v;
}

std::uint64_t parse_count(std::string_view text, std::string_view what) {
    if (!text.empty() && text.front() == '-')
        throw usage_error("invalid " + std::string(what) + " " + quoted(text) + " (counts cannot be negative)");
    const auto [value, suffix] = split_number(text, what);
    long double mult = 1;
    if (suffix.empty())
        mult = 1;
    else if (suffix == "K" || suffix == "k")
        mult = 1e3L;
    else if (suffix == "M")
        mult = 1e6L;
    else if (suffix == "G" || suffix == "B")
        mult = 1e9L;
    else
        throw usage_error("invalid " + std::string(what) + " " + quoted(text) + " (unknown suffix '" +
                          std::string(suffix) + "'; counts take K, M or G, powers of 1000)");
    const long double v = value * mult;
    if (v != std::floor(v))
        throw usage_error("invalid " + std::string(what) + " " + quoted(text) + " (not a whole number)");
    return to_u64(v, text, what);
}

std::string format_bytes(std::uint64_t bytes) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) return std::to_string(bytes) + " B";
    long double v = static_cast<long double>(bytes);
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1Lf %s", v, units[u]);
    // 1023.96 GiB prints as "1024.0 GiB": move up a unit instead.
    if (v >= 1023.95L && u < 6) std::snprintf(buf, sizeof buf, "%.1Lf %s", v / 1024, units[u + 1]);
    return buf;
}

std::string format_count(std::uint64_t n) {
    std::string digits = std::to_string(n), out;
    const int len = static_cast<int>(digits.size());
    for (int i = 0; i < len; ++i) {
        if (i > 0 && (len - i) % 3 == 0) out += ',';
        out += digits[static_cast<std::size_t>(i)];
    }
    return out;
}

std::string format_rate(double bps) {
    char buf[32];
    if (bps >= 1e9)
        std::snprintf(buf, sizeof buf, "%.2f GB/s", bps / 1e9);
    else if (bps >= 1e6)
        std::snprintf(buf, sizeof buf, "%.1f MB/s", bps / 1e6);
    else
        std::snprintf(buf, sizeof buf, "%.1f kB/s", bps / 1e3);
    return buf;
}

std::string format_duration(double s) {
    char buf[48];
    if (s < 60)
        std::snprintf(buf, sizeof buf, "%.2f s", s);
    else if (s < 3600)
        std::snprintf(buf, sizeof buf, "%d min %02d s", int(s) / 60, int(s) % 60);
    else
        std::snprintf(buf, sizeof buf, "%d h %02d min", int(s) / 3600, (int(s) % 3600) / 60);
    return buf;
}

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view what) {
    std::uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        throw usage_error(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " x " + std::to_string(b) +
                          "); use smaller sizes");
    return r;
}

std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view what) {
    std::uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        throw usage_error(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " + " + std::to_string(b) +
                          "); use smaller sizes");
    return r;
}

} // namespace dstk
