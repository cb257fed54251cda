// dstk/dist/nccl.hpp in a build without NCCL (or without CUDA): built in
// place of nccl_reducer.cpp, so that callers need no #if of their own.
#include "dstk/dist/nccl.hpp"

#include "dstk/error.hpp"

namespace dstk::dist {
namespace {

[[noreturn]] void no_nccl() {
    throw no_fit_error("data-parallel training on GPUs (this dstk was built without NCCL) rebuild with CUDA and "
                       "NCCL found (nccl.h, libnccl), or train the ranks with --device cpu");
}

} // namespace

bool nccl_available() {
    return false;
}

NcclId nccl_unique_id() {
    no_nccl();
}

std::unique_ptr<Reducer> make_nccl_reducer(const NcclId&, int, int, int, double) {
    no_nccl();
}

} // namespace dstk::dist
