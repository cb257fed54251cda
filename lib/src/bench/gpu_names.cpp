#include "dstk/bench/gpu.hpp"
#include "dstk/enum_names.hpp"

namespace dstk::bench {
namespace {

// The names are the keys of dsbench's h2d cases ("h2d." + name).
constexpr EnumNames<Transfer, 6> transfer_names{{{{Transfer::pageable, "pageable"},
                                                  {Transfer::pinned, "pinned"},
                                                  {Transfer::managed_fault, "managed.fault"},
                                                  {Transfer::managed_prefetch, "managed.prefetch"},
                                                  {Transfer::managed_accessed_by, "managed.accessed_by"},
                                                  {Transfer::zero_copy, "zero_copy"}}}};

} // namespace

std::string_view transfer_name(Transfer t) {
    return transfer_names.name(t);
}

bool transfer_is_managed(Transfer t) {
    return t == Transfer::managed_fault || t == Transfer::managed_prefetch || t == Transfer::managed_accessed_by;
}

} // namespace dstk::bench
