#include "dstk/batch.hpp"

#include <stdexcept>

namespace dstk {

const BatchField* Batch::find(std::string_view name) const noexcept {
    for (const BatchField& f : fields)
        if (f.name == name) return &f;
    return nullptr;
}

const BatchField& Batch::field(std::string_view name) const {
    if (const BatchField* f = find(name)) return *f;
    std::string have;
    for (const BatchField& f : fields) have += (have.empty() ? "" : ", ") + f.name;
    throw std::logic_error("the batch has no field '" + std::string(name) +
                           "' (it has: " + (have.empty() ? "none" : have) + ")");
}

std::uint64_t Batch::sample_bytes() const {
    std::uint64_t n = 0;
    for (const BatchField& f : fields) n += f.sample_bytes();
    return n;
}

} // namespace dstk
