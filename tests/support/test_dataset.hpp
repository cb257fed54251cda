#pragma once
// Small datasets for tests, written through the library's DatasetWriter: u8
// samples of one shape and int32 labels, one or more splits, every sample made
// by a callback so that a test can check what it reads without keeping a copy.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dstk/dataset_writer.hpp"
#include "dstk/manifest.hpp"

namespace dstk::test_support {

// Writes the bytes of sample `index` (counted within its split) and returns
// its label. Called in order, splits in the order given, so a callback may
// carry state (an RNG) from one sample to the next.
using FillSample = std::function<std::int32_t(std::uint64_t index, std::span<std::uint8_t> bytes)>;

struct SplitSize {
    std::string name;
    std::uint64_t samples = 0; // a split of 0 samples is left out
};

// A fresh path under the test temp directory, unique to this process.
inline std::filesystem::path temp_path(const std::string& prefix, const std::string& name) {
    const auto p =
        std::filesystem::path(::testing::TempDir()) / (prefix + "_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    return p;
}

inline std::filesystem::path write_u8_dataset(const std::filesystem::path& dir, const Shape& shape,
                                              const std::vector<SplitSize>& splits, std::uint32_t classes,
                                              const FillSample& fill) {
    constexpr std::uint64_t block = 1024;
    const std::uint64_t sample_bytes = shape.numel();
    std::filesystem::remove_all(dir);
    DatasetWriter w(dir, false);
    Manifest m;
    std::vector<std::uint8_t> rows(block * sample_bytes);
    std::vector<std::int32_t> labels(block);
    for (const SplitSize& s : splits) {
        if (s.samples == 0) continue;
        SplitInfo split;
        split.name = s.name;
        split.samples = s.samples;
        auto x = w.npy_field(s.name, "x", DType::u8, shape, s.samples);
        auto y = w.npy_field(s.name, "y", DType::i32, Shape{}, s.samples);
        for (std::uint64_t first = 0; first < s.samples; first += block) {
            const std::uint64_t n = std::min(block, s.samples - first);
            for (std::uint64_t i = 0; i < n; ++i)
                labels[i] = fill(first + i, std::span(rows).subspan(i * sample_bytes, sample_bytes));
            x->append(rows.data(), n);
            y->append(labels.data(), n);
        }
        split.fields.push_back(x->finish());
        split.fields.push_back(y->finish());
        m.splits.push_back(split);
    }
    m.num_classes = classes;
    w.commit(m);
    return dir;
}

} // namespace dstk::test_support
