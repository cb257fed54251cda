#include "dstk/model/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"

namespace fs = std::filesystem;

namespace dstk::model {
namespace {

// The reference implementation refuses headers above 100 MB.
constexpr std::uint64_t max_header_bytes = 100'000'000;

struct DTypeName {
    DType dtype;
    const char* name;
};
constexpr DTypeName dtype_names[] = {
    {DType::u8, "U8"},   {DType::i8, "I8"},   {DType::u16, "U16"},   {DType::i16, "I16"}, {DType::i32, "I32"},
    {DType::i64, "I64"}, {DType::f16, "F16"}, {DType::bf16, "BF16"}, {DType::f32, "F32"}, {DType::f64, "F64"}};

const char* safetensors_dtype(DType t) {
    for (const auto& d : dtype_names)
        if (d.dtype == t) return d.name;
    throw std::logic_error("safetensors: unmapped dtype");
}

std::uint64_t shape_numel(const std::vector<std::uint64_t>& shape, const std::string& where) {
    std::uint64_t n = 1;
    for (const auto d : shape) {
        if (d != 0 && n > UINT64_MAX / d) throw runtime_error(where + ": shape overflows");
        n *= d;
    }
    return n;
}

} // namespace

std::uint64_t Tensor::numel() const {
    return shape_numel(shape, name);
}

std::vector<float> Tensor::floats() const {
    if (dtype != DType::f32)
        throw runtime_error("tensor '" + name + "' is " + std::string(dtype_name(dtype)) + " (expected f32)");
    std::vector<float> v(data.size() / 4);
    if (!v.empty()) std::memcpy(v.data(), data.data(), v.size() * 4);
    return v;
}

const Tensor* TensorFile::find(const std::string& name) const {
    for (const auto& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

Tensor f32_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const float> values) {
    Tensor t{std::move(name), DType::f32, std::move(shape), {}};
    if (t.numel() != values.size()) throw std::logic_error("f32_tensor: shape does not match the values");
    t.data.resize(values.size_bytes());
    if (!values.empty()) std::memcpy(t.data.data(), values.data(), values.size_bytes());
    return t;
}

Tensor i64_scalar(std::string name, std::int64_t value) {
    Tensor t{std::move(name), DType::i64, {}, std::vector<std::uint8_t>(8)};
    std::memcpy(t.data.data(), &value, 8);
    return t;
}

std::vector<std::uint8_t> encode_safetensors(const TensorFile& f) {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!f.metadata.empty()) h["__metadata__"] = f.metadata;
    std::uint64_t offset = 0;
    for (const auto& t : f.tensors) {
        if (t.data.size() != t.numel() * dtype_size(t.dtype))
            throw std::logic_error("safetensors: tensor '" + t.name + "' holds the wrong number of bytes");
        h[t.name] = {{"dtype", safetensors_dtype(t.dtype)},
                     {"shape", t.shape},
                     {"data_offsets", {offset, offset + t.data.size()}}};
        offset += t.data.size();
    }
    std::string header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');
    std::vector<std::uint8_t> out(8 + header.size() + offset);
    const std::uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    std::memcpy(out.data() + 8, header.data(), header.size());
    std::uint8_t* p = out.data() + 8 + header.size();
    for (const auto& t : f.tensors) {
        if (!t.data.empty()) std::memcpy(p, t.data.data(), t.data.size());
        p += t.data.size();
    }
    return out;
}

TensorFile decode_safetensors(std::span<const std::uint8_t> bytes, const std::string& source) {
    const std::string bad = " (not a safetensors file, or damaged); re-save the model with dstrain --save";
    if (bytes.size() < 8) throw runtime_error(source + ": " + std::to_string(bytes.size()) + " bytes" + bad);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    if (n > max_header_bytes || n > bytes.size() - 8)
        throw runtime_error(source + ": header of " + std::to_string(n) + " bytes in a file of " +
                            std::to_string(bytes.size()) + bad);
    const std::uint64_t data_bytes = bytes.size() - 8 - n;
    const std::uint8_t* data = bytes.data() + 8 + n;
    TensorFile f;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    try {
        const auto h = parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()) + 8, n));
        if (!h.is_object()) throw runtime_error(source + ": the header is not a JSON object" + bad);
        for (const auto& [name, v] : h.items()) {
            if (name == "__metadata__") {
                f.metadata = v.get<std::map<std::string, std::string>>();
                continue;
            }
            Tensor t;
            t.name = name;
            const std::string dt = v.at("dtype").get<std::string>();
            const auto it = std::find_if(std::begin(dtype_names), std::end(dtype_names),
                                         [&](const DTypeName& d) { return dt == d.name; });
            if (it == std::end(dtype_names))
                throw runtime_error(source + ": tensor '" + name + "' has dtype " + dt + ", which dstk does not read");
            t.dtype = it->dtype;
            t.shape = v.at("shape").get<std::vector<std::uint64_t>>();
            const auto off = v.at("data_offsets").get<std::vector<std::uint64_t>>();
            const std::uint64_t numel = shape_numel(t.shape, source + ": tensor '" + name + "'");
            if (off.size() != 2 || off[0] > off[1] || off[1] > data_bytes ||
                numel > (off[1] - off[0]) / dtype_size(t.dtype) || off[1] - off[0] != numel * dtype_size(t.dtype))
                throw runtime_error(source + ": tensor '" + name + "' has offsets that do not match its shape or " +
                                    "lie past the end of the file" + bad);
            t.data.assign(data + off[0], data + off[1]);
            ranges.emplace_back(off[0], off[1]);
            f.tensors.push_back(std::move(t));
        }
    } catch (const nlohmann::json::exception& e) {
        throw runtime_error(source + ": header: " + e.what() + bad);
    }
    // Tensors tile the data exactly: sort by offset, each starts where the last ended.
    std::vector<std::size_t> order(f.tensors.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ranges[a] < ranges[b]; });
    std::uint64_t at = 0;
    std::vector<Tensor> sorted;
    for (const auto i : order) {
        if (ranges[i].first != at)
            throw runtime_error(source + ": tensor '" + f.tensors[i].name + "' overlaps another or leaves a gap" + bad);
        at = ranges[i].second;
        sorted.push_back(std::move(f.tensors[i]));
    }
    if (at != data_bytes)
        throw runtime_error(source + ": " + std::to_string(data_bytes - at) + " bytes after the last tensor" + bad);
    f.tensors = std::move(sorted);
    return f;
}

TensorFile read_safetensors(const fs::path& path) {
    const UniqueFd fd = open_input_file(path, "model");
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("cannot stat model", path.string());
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
    read_all(fd.get(), bytes.data(), bytes.size(), 0, path);
    return decode_safetensors(bytes, path.string());
}

} // namespace dstk::model
