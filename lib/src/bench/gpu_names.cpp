#include "dstk/bench/gpu.hpp"

namespace dstk::bench {

std::string_view transfer_name(Transfer t) {
    switch (t) {
    case Transfer::pageable:
        return "pageable";
    case Transfer::pinned:
        return "pinned";
    case Transfer::managed_fault:
        return "managed.fault";
    case Transfer::managed_prefetch:
        return "managed.prefetch";
    case Transfer::managed_accessed_by:
        return "managed.accessed_by";
    case Transfer::zero_copy:
        return "zero_copy";
    }
    return "?";
}

bool transfer_is_managed(Transfer t) {
    return t == Transfer::managed_fault || t == Transfer::managed_prefetch || t == Transfer::managed_accessed_by;
}

} // namespace dstk::bench
