#include "dstk/shape.hpp"

#include <charconv>

#include "dstk/error.hpp"
#include "dstk/units.hpp"

namespace dstk {

std::uint64_t Shape::numel() const {
    std::uint64_t n = 1;
    for (auto d : dims) n = checked_mul(n, d, "shape " + str());
    return n;
}

std::string Shape::str() const {
    if (dims.empty()) return "scalar";
    std::string s;
    for (std::size_t i = 0; i < dims.size(); ++i) {
        if (i) s += 'x';
        s += std::to_string(dims[i]);
    }
    return s;
}

Shape parse_shape(std::string_view text, std::string_view what) {
    if (text == "scalar") return {};
    Shape shape;
    const auto bad = [&](const std::string& why) {
        return usage_error("invalid " + std::string(what) + " '" + std::string(text) + "' (" + why +
                           "); write dimensions separated by x, e.g. 3x32x32, or 'scalar'");
    };
    if (text.empty()) throw bad("empty");
    std::size_t pos = 0;
    while (pos <= text.size()) {
        const std::size_t end = std::min(text.find_first_of("x,", pos), text.size());
        const std::string_view part = text.substr(pos, end - pos);
        std::uint64_t d = 0;
        const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), d);
        if (part.empty() || ec != std::errc() || ptr != part.data() + part.size())
            throw bad("'" + std::string(part) + "' is not a positive whole number");
        if (d == 0) throw bad("dimensions must be at least 1");
        shape.dims.push_back(d);
        if (shape.dims.size() > 8) throw bad("more than 8 dimensions");
        pos = end + 1;
    }
    (void)shape.numel(); // overflow check
    return shape;
}

std::uint64_t sample_bytes(const Shape& shape, DType dtype) {
    return checked_mul(shape.numel(), dtype_size(dtype), "sample size of shape " + shape.str());
}

} // namespace dstk
