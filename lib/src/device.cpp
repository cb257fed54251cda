#include "dstk/device.hpp"

#include <string>

#include "dstk/error.hpp"

namespace dstk {

Device parse_device(std::string_view text) {
    if (text == "cpu") return {Backend::cpu, 0};
    if (text == "cuda") return {Backend::cuda, 0};
    if (text.substr(0, 5) == "cuda:" && text.size() > 5 && text.size() < 9) {
        int idx = 0;
        for (const char ch : text.substr(5)) {
            if (ch < '0' || ch > '9') idx = -1;
            if (idx < 0) break;
            idx = idx * 10 + (ch - '0');
        }
        if (idx >= 0) return {Backend::cuda, idx};
    }
    throw usage_error("invalid --device '" + std::string(text) + "' (expected cpu, cuda or cuda:N)");
}

std::string device_name(const Device& d) {
    return d.backend == Backend::cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

} // namespace dstk
