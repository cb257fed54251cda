#pragma once
// A dataset of four fields of different dtypes, per-sample shapes and
// storages (write_fields_dataset), and the check that a batch holds, field by
// field, the dataset's values at the order's sample indices: the shared
// ground truth of the multi-field tests on the CPU (tests/unit) and the GPU
// (tests/gpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "dstk/batch.hpp"
#include "dstk/data/order.hpp"
#include "support/test_dataset.hpp"

namespace dstk::test_support {

// How the four fields are stored.
//   npy    every field .npy but `target`, zstd-chunked with chunks of 48
//          samples (not the order's chunk)
//   zstd   image zstd-chunked in chunks of 64 (the lead field: the order's
//          chunk), target in 48, result in 100, label .npy
//   parts  every field in parts cut anywhere (an empty part, a part of one
//          sample, cuts inside chunks), .npy and zstd mixed
enum class FieldsStorage { npy, zstd, parts };

inline const char* storage_name(FieldsStorage s) {
    return s == FieldsStorage::npy ? "npy" : s == FieldsStorage::zstd ? "zstd" : "parts";
}

// image u8[1,6,6] (the input role), target f32[7], result i8, label i32 (the label role).
inline std::vector<FieldSpec> four_fields(FieldsStorage s) {
    std::vector<FieldSpec> f{{"image", DType::u8, Shape{{1, 6, 6}}, 0, {}},
                             {"target", DType::f32, Shape{{7}}, 48, {}},
                             {"result", DType::i8, Shape{}, 0, {}},
                             {"label", DType::i32, Shape{}, 0, {}}};
    if (s == FieldsStorage::zstd) {
        f[0].zstd_chunk = 64;
        f[2].zstd_chunk = 100;
    } else if (s == FieldsStorage::parts) {
        f[0].parts = {150, 0, 1};
        f[1].parts = {100};
        f[2].parts = {333};
        f[3].zstd_chunk = 64;
        f[3].parts = {64, 64};
    }
    return f;
}

// The order's chunk a source delivering `names` visits when asked for
// `asked`: the storage chunk of the lead field (the most bytes per sample, the
// first of them) where it is zstd-chunked.
inline std::uint64_t order_chunk(const std::vector<FieldSpec>& specs, const std::vector<std::string>& names,
                                 std::uint64_t asked) {
    const FieldSpec* lead = nullptr;
    for (const std::string& n : names)
        for (const FieldSpec& f : specs)
            if (f.name == n && (!lead || f.sample_bytes() > lead->sample_bytes())) lead = &f;
    return lead && lead->zstd_chunk ? lead->zstd_chunk : asked;
}

// Sample i's values of a field: i32 fields hold i, f32 fields i + j / 8,
// one-byte fields a pattern of (i, j, f).
inline void sample_values(const FieldSpec& spec, std::size_t f, std::uint64_t i, std::span<std::uint8_t> out) {
    const std::uint64_t n = spec.shape.numel();
    for (std::uint64_t j = 0; j < n; ++j) {
        if (spec.dtype == DType::i32) {
            const auto v = static_cast<std::int32_t>(i + j);
            std::memcpy(out.data() + j * 4, &v, 4);
        } else if (spec.dtype == DType::f32) {
            const float v = static_cast<float>(i) + static_cast<float>(j) / 8.0f;
            std::memcpy(out.data() + j * 4, &v, 4);
        } else {
            out[j] = static_cast<std::uint8_t>(i * (2 * f + 3) + j * 7 + f * 31 + (i >> 8));
        }
    }
}

inline std::filesystem::path write_four_fields(const std::filesystem::path& dir, std::uint64_t samples,
                                               FieldsStorage s) {
    const std::vector<FieldSpec> specs = four_fields(s);
    FieldsDataset d{specs, {{"train", samples}}, "image", "label", 10};
    return write_fields_dataset(dir, d, [&](std::size_t f, std::uint64_t i, std::span<std::uint8_t> out) {
        sample_values(specs[f], f, i, out);
    });
}

// Every field of `b` (data in host memory) holds, row by row, the values of
// sample order[first + row]; the fields are those of `specs` named `names`,
// in that order. Fails the test at the first difference, naming it.
inline void expect_batch_is(const Batch& b, const std::vector<FieldSpec>& specs, const std::vector<std::string>& names,
                            const data::EpochOrder& order, std::uint64_t first, const std::string& what) {
    ASSERT_EQ(b.fields.size(), names.size()) << what;
    for (std::size_t k = 0; k < names.size(); ++k) {
        std::size_t f = 0;
        while (f < specs.size() && specs[f].name != names[k]) ++f;
        ASSERT_LT(f, specs.size()) << what << ": no field " << names[k];
        const BatchField& field = b.fields[k];
        ASSERT_EQ(field.name, names[k]) << what;
        ASSERT_EQ(field.dtype, specs[f].dtype) << what << " " << names[k];
        ASSERT_EQ(field.shape.dims, specs[f].shape.dims) << what << " " << names[k];
        const std::uint64_t sb = specs[f].sample_bytes();
        std::vector<std::uint8_t> want(sb);
        for (std::uint32_t row = 0; row < b.size; ++row) {
            const std::uint64_t sample = order[first + row];
            sample_values(specs[f], f, sample, want);
            ASSERT_EQ(std::memcmp(static_cast<const std::uint8_t*>(field.data) + row * sb, want.data(), sb), 0)
                << what << ": field " << names[k] << " of position " << first + row << " is not sample " << sample;
        }
    }
}

} // namespace dstk::test_support
