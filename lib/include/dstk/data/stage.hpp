#pragma once
// The stages of the training data path, named the same wherever a stage is
// said to limit an epoch: dstrain's epoch line (measured) and dsplan's epoch
// estimate (predicted).
#include <cstdint>
#include <string_view>

namespace dstk::data {

enum class Stage : std::uint8_t { compute, read, decode, h2d };
// "compute", "read (disk)", "decode (zstd)", "h2d (host to device)"
std::string_view stage_name(Stage s);

} // namespace dstk::data
