#pragma once
// The input and labels of the batches a BatchSource hands out, for tests of
// datasets with an input field "x" and a label field "y" (test_dataset.hpp).
#include <cstdint>

#include "dstk/data/batch_source.hpp"

namespace dstk::test_support {

struct XY {
    const void* x = nullptr;
    const std::int32_t* y = nullptr;
    std::uint32_t size = 0;
};

// The source's next batch as x and y; false at the end of the epoch.
inline bool next_xy(data::BatchSource& s, XY& out) {
    const Batch* b = s.next();
    if (!b) return false;
    out = {b->field("x").data, static_cast<const std::int32_t*>(b->field("y").data), b->size};
    return true;
}

} // namespace dstk::test_support
