#pragma once
// Small datasets for tests, written through the library's DatasetWriter: u8
// samples of one shape and int32 labels (write_u8_dataset), or any fields of
// any dtype, shape and storage (write_fields_dataset); one or more splits,
// every sample made by a callback so that a test can check what it reads
// without keeping a copy.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "dstk/chunked_file.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/manifest.hpp"
#include "dstk/thread_pool.hpp"

namespace dstk::test_support {

// Writes the bytes of sample `index` (counted within its split) and returns
// its label. Called in order, splits in the order given, so a callback may
// carry state (an RNG) from one sample to the next.
using FillSample = std::function<std::int32_t(std::uint64_t index, std::span<std::uint8_t> bytes)>;

struct SplitSize {
    std::string name;
    std::uint64_t samples = 0; // a split of 0 samples is left out
};

// The paths temp_path handed out, removed as the process that asked for them
// exits: ctest runs every test in a process of its own, each of which would
// otherwise leave its pid-named directories behind. A forked child (a death
// test) exiting removes nothing of its parent's.
struct TempPaths {
    pid_t owner = ::getpid();
    std::vector<std::filesystem::path> paths;
    ~TempPaths() {
        if (::getpid() != owner) return;
        std::error_code ec;
        for (const auto& p : paths) std::filesystem::remove_all(p, ec);
    }
};
inline TempPaths& temp_paths() {
    static TempPaths t;
    return t;
}

// A fresh path under the test temp directory, unique to this process and
// removed when it exits.
inline std::filesystem::path temp_path(const std::string& prefix, const std::string& name) {
    const auto p =
        std::filesystem::path(::testing::TempDir()) / (prefix + "_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    temp_paths().paths.push_back(p);
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

// One field of a multi-field dataset: any dtype and per-sample shape, stored
// as .npy or zstd-chunked, in one file or in parts.
struct FieldSpec {
    std::string name;
    DType dtype = DType::u8;
    Shape shape;
    std::uint64_t zstd_chunk = 0; // 0: .npy; else zstd-chunked with chunks of this many samples
    // Samples of each part but the last, which takes the rest of the split;
    // empty: one file.
    std::vector<std::uint64_t> parts;

    std::uint64_t sample_bytes() const { return dstk::sample_bytes(shape, dtype); }
};

// Writes the bytes of sample `index` (counted within its split) of field
// `field` (an index into the dataset's fields).
using FillField = std::function<void(std::size_t field, std::uint64_t index, std::span<std::uint8_t> bytes)>;

struct FieldsDataset {
    std::vector<FieldSpec> fields;
    std::vector<SplitSize> splits;
    std::string input_field, label_field; // the manifest's roles; label_field empty: none
    std::optional<std::uint32_t> classes;
};

namespace detail {

// Samples [first, first + count) of field f into one file named `name` in the
// dataset's temporary directory; returns the part's entry.
inline FieldPart write_field_file(DatasetWriter& w, const std::string& name, const FieldSpec& spec, std::size_t f,
                                  std::uint64_t first, std::uint64_t count, const FillField& fill) {
    const std::uint64_t sb = spec.sample_bytes();
    std::vector<std::uint8_t> rows(count * sb);
    for (std::uint64_t i = 0; i < count; ++i) fill(f, first + i, std::span(rows).subspan(i * sb, sb));
    FieldPart part{name, count, 0, ""};
    if (spec.zstd_chunk == 0) {
        NpyFieldWriter out(w.file(name), name, spec.name, spec.dtype, spec.shape, count);
        out.append(rows.data(), count);
        const FieldInfo done = out.finish();
        part.bytes = done.bytes;
        part.checksum = done.checksum;
    } else {
        ThreadPool pool(1);
        ChunkedWriter out(w.file(name), sb, spec.zstd_chunk, 1, pool);
        out.append(rows.data(), count);
        part.checksum = out.finish();
        part.bytes = out.file_bytes();
    }
    return part;
}

// Field f of a split of `samples`, in one file or in parts.
inline FieldInfo write_field(DatasetWriter& w, const std::string& split, std::uint64_t samples, const FieldSpec& spec,
                             std::size_t f, const FillField& fill) {
    FieldInfo info;
    info.name = spec.name;
    info.dtype = spec.dtype;
    info.shape = spec.shape;
    info.storage = spec.zstd_chunk ? Storage::zstd_chunked : Storage::npy;
    info.chunk_samples = spec.zstd_chunk;
    const std::string base = split + "_" + spec.name, ext = spec.zstd_chunk ? ".zst" : ".npy";
    if (spec.parts.empty()) {
        const FieldPart one = write_field_file(w, base + ext, spec, f, 0, samples, fill);
        info.file = one.file;
        info.bytes = one.bytes;
        info.checksum = one.checksum;
        return info;
    }
    std::vector<std::uint64_t> sizes = spec.parts;
    std::uint64_t first = 0;
    for (const std::uint64_t n : sizes) first += n;
    if (first > samples) throw std::logic_error("write_field: parts longer than the split");
    sizes.push_back(samples - first);
    first = 0;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
        info.parts.push_back(
            write_field_file(w, base + ".part" + std::to_string(p) + ext, spec, f, first, sizes[p], fill));
        info.bytes += info.parts.back().bytes;
        first += sizes[p];
    }
    return info;
}

} // namespace detail

inline std::filesystem::path write_fields_dataset(const std::filesystem::path& dir, const FieldsDataset& d,
                                                  const FillField& fill) {
    std::filesystem::remove_all(dir);
    DatasetWriter w(dir, false);
    Manifest m;
    for (const SplitSize& s : d.splits) {
        if (s.samples == 0) continue;
        SplitInfo split;
        split.name = s.name;
        split.samples = s.samples;
        for (std::size_t f = 0; f < d.fields.size(); ++f)
            split.fields.push_back(detail::write_field(w, s.name, s.samples, d.fields[f], f, fill));
        m.splits.push_back(split);
    }
    m.input_field = d.input_field;
    m.label_field = d.label_field;
    m.num_classes = d.classes;
    m.provenance.tool = "test_dataset";
    w.commit(m);
    return dir;
}

} // namespace dstk::test_support
