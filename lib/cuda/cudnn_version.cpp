// cuDNN's version, in its own object: only what links it loads cuDNN
// (dstk/gpu_info.hpp says why).
#include <cudnn.h>

#include "dstk/gpu_info.hpp"

namespace dstk {

std::string cudnn_version() {
    const std::size_t v = cudnnGetVersion(); // 91400 -> 9.14.0
    return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

} // namespace dstk
