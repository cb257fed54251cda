// libFuzzer target: the safetensors reader and the saved-model checks must
// reject anything malformed with dstk::Error, never crash or read out of
// bounds, and what they accept must encode and decode to the same tensors.
#include <cstdint>
#include <span>

#include "dstk/error.hpp"
#include "dstk/model/saved_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace dstk::model;
    try {
        const TensorFile f = decode_safetensors(std::span<const std::uint8_t>(data, size), "fuzz.safetensors");
        const auto bytes = encode_safetensors(f);
        const TensorFile g = decode_safetensors(bytes, "again");
        if (g.tensors.size() != f.tensors.size() || g.metadata != f.metadata) __builtin_trap();
        for (std::size_t i = 0; i < f.tensors.size(); ++i)
            if (g.tensors[i].data != f.tensors[i].data || g.tensors[i].shape != f.tensors[i].shape) __builtin_trap();
        (void)from_tensor_file(f, "fuzz.safetensors");
    } catch (const dstk::Error&) {
    }
    return 0;
}
