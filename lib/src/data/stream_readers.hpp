#pragma once
// The StreamReader of each storage (stream_reader.cpp: .npy;
// stream_reader_zstd.cpp: zstd-chunked), over the field's files.
#include <memory>
#include <vector>

#include "dstk/data/stream_reader.hpp"
#include "field_files.hpp"

namespace dstk::data {

std::unique_ptr<StreamReader> npy_stream_reader(std::vector<FileSpec> files, const FieldInfo& field,
                                                std::uint64_t samples, const StreamSettings& settings);
std::unique_ptr<StreamReader> zstd_stream_reader(std::vector<FileSpec> files, const FieldInfo& field,
                                                 std::uint64_t samples, const StreamSettings& settings);

} // namespace dstk::data
