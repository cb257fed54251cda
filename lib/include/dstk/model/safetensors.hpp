#pragma once
// safetensors files (https://github.com/huggingface/safetensors): u64
// little-endian N, N bytes of JSON header, then the tensors' bytes, little
// endian, C order. The header maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end)} (offsets into the data after the header) and
// may hold "__metadata__", a map of strings to strings. The data is exactly
// the tensors laid end to end, no gaps, no overlaps; the header is padded
// with spaces so the data starts on an 8-byte boundary.
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dstk/dtype.hpp"

namespace dstk::model {

struct Tensor {
    std::string name;
    DType dtype = DType::f32;
    std::vector<std::uint64_t> shape; // empty: a scalar
    std::vector<std::uint8_t> data;   // numel * dtype_size bytes, little endian

    std::uint64_t numel() const;
    std::vector<float> floats() const; // f32 tensors only (runtime error otherwise)
};

struct TensorFile {
    std::vector<Tensor> tensors; // in the order written; read back in data-offset order
    std::map<std::string, std::string> metadata;

    const Tensor* find(const std::string& name) const;
};

Tensor f32_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const float> values);
Tensor i64_scalar(std::string name, std::int64_t value);

std::vector<std::uint8_t> encode_safetensors(const TensorFile& f);
// Checks every offset, size, dtype and name against the bytes; runtime error
// naming `source` otherwise.
TensorFile decode_safetensors(std::span<const std::uint8_t> bytes, const std::string& source);
TensorFile read_safetensors(const std::filesystem::path& path);

} // namespace dstk::model
