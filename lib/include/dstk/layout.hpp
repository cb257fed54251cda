#pragma once
// The order of a dataset's elements on disk. Sample-major (C order, a sample's
// features contiguous) is the native layout: a batch is one contiguous read.
// Feature-major (Fortran order, one feature of every sample contiguous) is the
// seeds' v28b layout: dsgen can write it, dsconvert reads and writes it.
#include <string_view>

namespace dstk {

enum class Layout { sample_major, feature_major };

// "sample-major" | "feature-major"; the older dsgen spellings "sample" and
// "feature" are accepted with a deprecation notice on stderr. Anything else is
// a usage error naming `option`.
Layout parse_layout(std::string_view text, std::string_view option = "--layout");
std::string_view layout_name(Layout layout);

} // namespace dstk
