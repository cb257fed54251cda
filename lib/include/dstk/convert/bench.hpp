#pragma once
// dsconvert --benchmark: the speed of the conversion kernels and of
// zstd-chunked compression on this machine.
#include "dstk/convert/options.hpp"

namespace dstk {

// dsconvert --benchmark [FILE]: prints the in-memory speed (per wall and per
// CPU second) of the f32 -> bf16, f32 -> f16, u8 -> f32 and u8 -> bf16
// kernels on 1 and all threads and, with FILE (its first 256
// MiB), of zstd-chunked compression and decompression at levels 1 and 3 (or
// the --compress level) through ChunkedWriter/ChunkedReader.
void run_convert_benchmark(const ConvertOptions& o);

} // namespace dstk
