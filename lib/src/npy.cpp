#include "dstk/npy.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <iterator>
#include <utility>
#include <fcntl.h>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/fd.hpp"
#include "dstk/error.hpp"
#include "dstk/units.hpp"

namespace dstk {
namespace {

constexpr unsigned char magic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t max_header_len = 1u << 20; // numpy itself refuses headers over 10 KB by default

// A parser for the Python dict literal numpy writes:
// {'descr': '<f4', 'fortran_order': False, 'shape': (10, 3, 32, 32), }
class DictParser {
  public:
    DictParser(std::string_view text, const std::string& source) : t_(text), source_(source) {}

    NpyHeader parse() {
        NpyHeader h;
        bool have_descr = false, have_order = false, have_shape = false;
        expect('{');
        for (;;) {
            skip_ws();
            if (peek() == '}') {
                ++i_;
                break;
            }
            const std::string key = string_literal();
            expect(':');
            skip_ws();
            if (key == "descr") {
                h.descr = string_literal();
                have_descr = true;
            } else if (key == "fortran_order") {
                h.fortran_order = boolean();
                have_order = true;
            } else if (key == "shape") {
                h.shape = tuple();
                have_shape = true;
            } else {
                fail("unexpected key '" + key + "'");
            }
            skip_ws();
            if (peek() == ',') {
                ++i_;
                continue;
            }
            expect('}');
            break;
        }
        if (!have_descr || !have_order || !have_shape)
            fail("the header must have 'descr', 'fortran_order' and 'shape'");
        return h;
    }

    [[noreturn]] void fail(const std::string& why) const {
        throw runtime_error(source_ + ": not a valid .npy header (" + why + ")");
    }

  private:
    char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
    void skip_ws() {
        while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
    }
    void expect(char c) {
        skip_ws();
        if (peek() != c) fail(std::string("expected '") + c + "' at byte " + std::to_string(i_));
        ++i_;
    }
    std::string string_literal() {
        skip_ws();
        const char q = peek();
        if (q != '\'' && q != '"') fail("expected a quoted string at byte " + std::to_string(i_));
        const std::size_t end = t_.find(q, i_ + 1);
        if (end == std::string_view::npos) fail("unterminated string");
        std::string s(t_.substr(i_ + 1, end - i_ - 1));
        i_ = end + 1;
        return s;
    }
    bool boolean() {
        if (t_.substr(i_, 4) == "True") {
            i_ += 4;
            return true;
        }
        if (t_.substr(i_, 5) == "False") {
            i_ += 5;
            return false;
        }
        fail("fortran_order must be True or False");
    }
    std::vector<std::uint64_t> tuple() {
        std::vector<std::uint64_t> dims;
        expect('(');
        for (;;) {
            skip_ws();
            if (peek() == ')') {
                ++i_;
                return dims;
            }
            if (!std::isdigit(static_cast<unsigned char>(peek())))
                fail("shape must be a tuple of non-negative integers");
            std::uint64_t v = 0;
            while (std::isdigit(static_cast<unsigned char>(peek()))) {
                const std::uint64_t digit = static_cast<std::uint64_t>(peek() - '0');
                if (v > (UINT64_MAX - digit) / 10) fail("shape dimension overflows 64 bits");
                v = v * 10 + digit;
                ++i_;
            }
            while (peek() == 'L') ++i_; // Python 2 longs
            dims.push_back(v);
            if (dims.size() > 32) fail("more than 32 dimensions");
            skip_ws();
            if (peek() == ',') {
                ++i_;
                continue;
            }
            expect(')');
            return dims;
        }
    }

    std::string_view t_;
    std::string source_;
    std::size_t i_ = 0;
};

struct DescrInfo {
    DType dtype;
    bool big_endian;
};

std::optional<DescrInfo> parse_descr(const std::string& d) {
    if (d.size() < 3) return std::nullopt;
    const char order = d[0];
    if (order != '<' && order != '>' && order != '|' && order != '=') return std::nullopt;
    // The type codes read ('b1', numpy's bool, reads as u8); bf16 has none of its own.
    static constexpr std::pair<std::string_view, DType> codes[] = {
        {"u1", DType::u8},  {"b1", DType::u8},  {"i1", DType::i8},  {"u2", DType::u16}, {"i2", DType::i16},
        {"i4", DType::i32}, {"i8", DType::i64}, {"f2", DType::f16}, {"f4", DType::f32}, {"f8", DType::f64}};
    const std::string_view code = std::string_view(d).substr(1);
    const auto* hit = std::find_if(std::begin(codes), std::end(codes), [&](const auto& c) { return c.first == code; });
    if (hit == std::end(codes)) return std::nullopt;
    const DType t = hit->second;
    const bool big = order == '>' && dtype_size(t) > 1;
    return DescrInfo{t, big};
}

} // namespace

std::uint64_t NpyHeader::count() const {
    std::uint64_t n = 1;
    for (auto d : shape) n = checked_mul(n, d, "npy shape");
    return n;
}

std::uint64_t NpyHeader::data_bytes() const {
    return checked_mul(count(), dtype_size(dtype), "npy data size");
}

NpyHeader parse_npy_header(std::span<const std::uint8_t> bytes, const std::string& source) {
    if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, sizeof magic) != 0)
        throw runtime_error(source + ": not a .npy file (missing the \\x93NUMPY magic)");
    const int major = bytes[6];
    std::size_t header_len = 0, prefix = 0;
    if (major == 1) {
        header_len = bytes[8] | (std::size_t{bytes[9]} << 8);
        prefix = 10;
    } else if (major == 2 || major == 3) {
        if (bytes.size() < 12) throw runtime_error(source + ": .npy header truncated");
        header_len =
            bytes[8] | (std::size_t{bytes[9]} << 8) | (std::size_t{bytes[10]} << 16) | (std::size_t{bytes[11]} << 24);
        prefix = 12;
    } else {
        throw runtime_error(source + ": unsupported .npy format version " + std::to_string(major) +
                            " (dstk reads 1.0, 2.0 and 3.0)");
    }
    if (header_len > max_header_len) throw runtime_error(source + ": .npy header too large (corrupt?)");
    if (bytes.size() < prefix + header_len)
        throw runtime_error(source + ": .npy header truncated (file shorter than its header length)");
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + prefix, header_len);
    DictParser parser(text, source);
    NpyHeader h = parser.parse();
    h.major_version = major;
    h.data_offset = prefix + header_len;
    const auto info = parse_descr(h.descr);
    if (!info)
        throw runtime_error(source + ": unsupported .npy dtype '" + h.descr +
                            "' (dstk reads u1 i1 u2 i2 i4 i8 f2 f4 f8, either byte order)");
    h.dtype = info->dtype;
    h.big_endian = info->big_endian;
    try {
        (void)h.data_bytes();
    } catch (const Error&) {
        throw runtime_error(source + ": .npy shape overflows 64 bits (corrupt header)");
    }
    return h;
}

NpyHeader read_npy_header_fd(int fd, const std::string& source) {
    std::vector<std::uint8_t> buf(12);
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
    if (n < 0) throw_errno("cannot read", source);
    if (n < 10) throw runtime_error(source + ": not a .npy file (shorter than a header)");
    buf.resize(static_cast<std::size_t>(n));
    std::size_t need = buf[6] == 1
                           ? 10 + (buf[8] | (std::size_t{buf[9]} << 8))
                           : (buf.size() >= 12 ? 12 + (buf[8] | (std::size_t{buf[9]} << 8) |
                                                       (std::size_t{buf[10]} << 16) | (std::size_t{buf[11]} << 24))
                                               : 12);
    need = std::min(need, max_header_len + 12);
    buf.resize(need);
    const ssize_t m = ::pread(fd, buf.data(), need, 0);
    if (m < 0) throw_errno("cannot read", source);
    buf.resize(static_cast<std::size_t>(m));
    return parse_npy_header(buf, source);
}

NpyHeader read_npy_header(const std::filesystem::path& path) {
    const UniqueFd fd = open_input_file(path, ".npy file");
    return read_npy_header_fd(fd.get(), path.string());
}

std::string make_npy_header(DType dtype, const std::vector<std::uint64_t>& shape, bool fortran_order) {
    std::string dict =
        "{'descr': '" + npy_descr(dtype) + "', 'fortran_order': " + (fortran_order ? "True" : "False") + ", 'shape': (";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        dict += std::to_string(shape[i]);
        if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
        if (i + 1 < shape.size()) dict += " ";
    }
    dict += "), }";
    // Pad with spaces and a final newline so the data starts on a 64-byte boundary.
    int major = 1;
    std::size_t prefix = 10;
    std::size_t total = prefix + dict.size() + 1;
    std::size_t padded = (total + 63) / 64 * 64;
    if (padded - prefix > 65535) {
        major = 2;
        prefix = 12;
        total = prefix + dict.size() + 1;
        padded = (total + 63) / 64 * 64;
    }
    const std::size_t header_len = padded - prefix;
    dict.append(header_len - dict.size() - 1, ' ');
    dict += '\n';
    std::string out(reinterpret_cast<const char*>(magic), sizeof magic);
    out += static_cast<char>(major);
    out += '\0';
    out += static_cast<char>(header_len & 0xFF);
    out += static_cast<char>((header_len >> 8) & 0xFF);
    if (major == 2) {
        out += static_cast<char>((header_len >> 16) & 0xFF);
        out += static_cast<char>((header_len >> 24) & 0xFF);
    }
    return out + dict;
}

} // namespace dstk
