#pragma once
// TensorBoard event files, as `tensorboard --logdir DIR` reads them
// (dstrain --tensorboard DIR).
//
// A file is a sequence of TFRecords, each
//   u64 length | u32 masked CRC-32C of the 8 length bytes | data | u32 masked CRC-32C of data
// (little-endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), whose
// data is one serialised Event message (tensorflow's event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; each later one the
// scalars of one step. TensorBoard shows simple_value as scalar charts,
// grouped by the tag's part before the first '/'.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dstk/fd.hpp"

namespace dstk::run {

struct Scalar {
    std::string tag; // "loss/train"
    double value = 0;
};

// CRC-32C with TensorBoard's mask.
std::uint32_t masked_crc32c(const void* data, std::size_t len);
// One TFRecord around `data`.
std::string tfrecord(std::string_view data);
// Serialised Event messages.
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, std::int64_t step, const std::vector<Scalar>& values);

// One run's event file: a new file in `dir` (created with its parents when
// missing) named events.out.tfevents.<seconds>.<host>.<pid>.<n>, the first
// free n: an existing file is never replaced, nor written through a link.
// Each record is written whole as it comes, so TensorBoard shows a run while
// it trains and a crash leaves every record before it readable.
class EventFile {
  public:
    explicit EventFile(const std::filesystem::path& dir);
    // One Event with these scalars at `step`, stamped with the wall time now.
    void write(std::int64_t step, const std::vector<Scalar>& values);
    const std::filesystem::path& path() const { return path_; }

  private:
    void append(std::string_view record);
    std::filesystem::path path_;
    UniqueFd fd_;
};

} // namespace dstk::run
