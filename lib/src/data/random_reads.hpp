#pragma once
// How fast single samples can be read at random from a field of a split:
// what the full order on a stream costs once the split is larger than memory
// (plan_source warns with it).
#include <cstdint>
#include <filesystem>
#include <string>

#include "dstk/dataset.hpp"

namespace dstk::data {

struct RandomReadRate {
    double samples_per_second = 0;
    std::string source; // "dsbench's io.rand.sample.pread.cold (B.json)", "a probe of random O_DIRECT sample reads"
};

// From dsbench's io.rand.sample.pread.cold figure when `bench` names results
// that hold one (scaled to `readers` threads; .npy storage), else from a
// probe of about a quarter of a second through a StreamReader of the field:
// random O_DIRECT sample reads (page-cache reads where the filesystem refuses
// O_DIRECT) on `readers` threads; zstd-chunked storage: a chunk decoded per
// sample read.
RandomReadRate predict_random_reads(const Dataset& ds, const SplitInfo& split, const FieldInfo& field,
                                    const std::filesystem::path& bench, unsigned readers);

} // namespace dstk::data
