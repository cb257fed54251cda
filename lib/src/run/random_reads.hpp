#pragma once
// How fast single samples can be read at random from a dataset's input file:
// what --order full on a stream costs once the split is larger than memory.
#include <cstdint>
#include <filesystem>
#include <string>

#include "dstk/dataset.hpp"

namespace dstk::run {

struct RandomReadRate {
    double samples_per_second = 0;
    std::string source; // "dsbench's io.rand.sample.pread.cold (B.json)", "a probe of 64 O_DIRECT reads"
};

// From --bench's io.rand.sample.pread.cold figure when `bench` names results
// that hold one (scaled to `readers` threads), else from a probe of about a
// quarter of a second: random O_DIRECT sample reads (page-cache reads where
// the filesystem refuses O_DIRECT) on `readers` threads; zstd-chunked
// storage: random chunk decodes, one per sample read.
RandomReadRate predict_random_reads(const Dataset& ds, const FieldInfo& x, const std::filesystem::path& bench,
                                    unsigned readers);

} // namespace dstk::run
