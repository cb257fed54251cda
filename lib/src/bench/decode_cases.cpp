// Decode cases: zstd chunk decompression (libzstd, on chunks of the target's
// data compressed in memory; and through ChunkedReader on a zstd-chunked
// dataset), and dtype conversion u8/bf16/f16 -> f32 on the CPU and the GPU.
#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "dstk/bench/case.hpp"
#include "dstk/bench/gpu.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"
#include "dstk/widen.hpp"

namespace dstk::bench {
namespace {

constexpr std::uint64_t zstd_sample_bytes = 64ull << 20; // data compressed per decode run
constexpr std::uint64_t convert_elements = 16ull << 20;  // values converted per run

bool target_is_chunked(const CaseContext& ctx) {
    return ctx.target && ctx.target->field && ctx.target->field->storage == Storage::zstd_chunked;
}

// Up to zstd_sample_bytes of the target's data, uncompressed, whole samples.
std::vector<std::uint8_t> target_data(const Target& t) {
    const std::uint64_t n = std::max<std::uint64_t>(1, std::min(t.data_bytes, zstd_sample_bytes) / t.sample_bytes);
    std::vector<std::uint8_t> data(n * t.sample_bytes);
    if (t.dataset_dir) {
        const Dataset ds = Dataset::open(*t.dataset_dir);
        ds.read(t.split, t.field->name, 0, n, data.data());
        return data;
    }
    const int fd = ::open(t.file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open", t.file.string());
    std::uint64_t got = 0;
    while (got < data.size()) {
        const ssize_t r = ::pread(fd, data.data() + got, data.size() - got, static_cast<off_t>(got));
        if (r <= 0) {
            ::close(fd);
            if (r < 0) throw_errno("cannot read", t.file.string());
            break;
        }
        got += std::uint64_t(r);
    }
    ::close(fd);
    data.resize(got / t.sample_bytes * t.sample_bytes);
    return data;
}

struct Chunk {
    std::vector<std::uint8_t> compressed;
    std::uint64_t offset = 0, bytes = 0; // in the uncompressed data
};

std::vector<CaseResult> run_zstd(const CaseContext& ctx) {
    const Target& t = *ctx.target;
    const std::vector<std::uint8_t> data = target_data(t);
    if (data.empty()) throw runtime_error(t.file.string() + ": holds less than one sample");
    const std::uint64_t chunk = std::max(t.sample_bytes, ctx.settings.chunk_bytes / t.sample_bytes * t.sample_bytes);
    std::vector<Chunk> chunks;
    std::uint64_t compressed_total = 0;
    for (std::uint64_t off = 0; off < data.size(); off += chunk) {
        Chunk c;
        c.offset = off;
        c.bytes = std::min<std::uint64_t>(chunk, data.size() - off);
        c.compressed.resize(ZSTD_compressBound(c.bytes));
        const std::size_t n = ZSTD_compress(c.compressed.data(), c.compressed.size(), data.data() + off, c.bytes,
                                            ctx.settings.zstd_level);
        if (ZSTD_isError(n)) throw runtime_error(std::string("zstd compression failed (") + ZSTD_getErrorName(n) + ")");
        c.compressed.resize(n);
        compressed_total += n;
        chunks.push_back(std::move(c));
    }
    std::vector<CaseResult> results;
    for (unsigned threads : ctx.settings.threads) {
        ThreadPool pool(threads);
        std::vector<std::vector<std::uint8_t>> out(threads, std::vector<std::uint8_t>(chunk));
        std::vector<ZSTD_DCtx*> dctx(threads);
        for (auto& d : dctx) d = ZSTD_createDCtx();
        std::atomic<bool> bad{false};
        auto pass = [&]() -> double {
            std::atomic<std::uint64_t> next{0};
            const double t0 = now_seconds();
            pool.parallel_for(threads, [&](std::uint64_t w) {
                for (std::uint64_t i; (i = next.fetch_add(1)) < chunks.size();) {
                    const Chunk& c = chunks[i];
                    const std::size_t n =
                        ZSTD_decompressDCtx(dctx[w], out[w].data(), c.bytes, c.compressed.data(), c.compressed.size());
                    if (ZSTD_isError(n) || n != c.bytes) bad = true;
                }
            });
            return now_seconds() - t0;
        };
        std::vector<double> seconds;
        try {
            seconds = time_repetitions(ctx.settings.repeat, {}, pass);
        } catch (...) {
            for (auto d : dctx) ZSTD_freeDCtx(d);
            throw;
        }
        for (auto d : dctx) ZSTD_freeDCtx(d);
        if (bad) throw runtime_error("zstd decompression of an in-memory chunk failed (library bug?)");
        CaseResult r;
        r.variant = variant_threads(threads);
        r.params = {{"threads", threads},
                    {"chunk_bytes", chunk},
                    {"chunks", chunks.size()},
                    {"level", ctx.settings.zstd_level},
                    {"ratio", double(data.size()) / double(compressed_total)}};
        r.repetitions = static_cast<unsigned>(seconds.size());
        r.metrics["rate"] = rate_metric(double(data.size()), seconds, "B/s");
        r.metrics["samples_rate"] = rate_metric(double(data.size() / t.sample_bytes), seconds, "samples/s");
        results.push_back(std::move(r));
    }
    return results;
}

// Decodes the first chunks of a zstd-chunked dataset (up to --size
// uncompressed bytes) from the file with ChunkedReader, as dstrain reads them.
std::vector<CaseResult> run_chunked(const CaseContext& ctx) {
    const ChunkedReader reader(ctx.target->file);
    const std::uint64_t max_chunk = reader.max_chunk_bytes();
    std::uint64_t n = 0, bytes = 0;
    while (n < reader.chunks() && (n == 0 || bytes + reader.chunk_bytes(n) <= ctx.settings.size_bytes))
        bytes += reader.chunk_bytes(n++);
    std::vector<CaseResult> results;
    for (unsigned threads : ctx.settings.threads) {
        ThreadPool pool(threads);
        std::vector<std::vector<std::uint8_t>> out(threads, std::vector<std::uint8_t>(max_chunk));
        auto pass = [&]() -> double {
            std::atomic<std::uint64_t> next{0};
            const double t0 = now_seconds();
            pool.parallel_for(threads, [&](std::uint64_t w) {
                for (std::uint64_t i; (i = next.fetch_add(1)) < n;) reader.read_chunk(i, out[w].data());
            });
            return now_seconds() - t0;
        };
        const auto seconds = time_repetitions(ctx.settings.repeat, {}, pass);
        CaseResult r;
        r.variant = variant_threads(threads);
        r.params = {{"threads", threads}, {"chunks", n}, {"chunk_samples", reader.chunk_samples()}, {"cache", "warm"}};
        r.repetitions = static_cast<unsigned>(seconds.size());
        r.metrics["rate"] = rate_metric(double(bytes), seconds, "B/s");
        r.metrics["samples_rate"] = rate_metric(double(bytes / reader.sample_bytes()), seconds, "samples/s");
        results.push_back(std::move(r));
    }
    return results;
}

// Input values that exercise every path of the conversion (not all zeros).
std::vector<std::uint8_t> convert_input(DType from, std::uint64_t elements, std::uint64_t seed) {
    std::vector<std::uint8_t> in(elements * dtype_size(from));
    SplitMix64 rng(seed);
    if (from == DType::u8) {
        for (auto& v : in) v = static_cast<std::uint8_t>(rng.next());
    } else {
        auto* h = reinterpret_cast<std::uint16_t*>(in.data());
        for (std::uint64_t i = 0; i < elements; ++i) {
            const float f = float(int(rng.next() % 20001) - 10000) / 997.0f;
            h[i] = from == DType::bf16 ? float_to_bf16(f) : float_to_f16(f);
        }
    }
    return in;
}

// The core's widening (dtype.hpp), typed per loop as the trainer's conversion is.
template <DType T> void widen_block(const std::uint8_t* in, float* out, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>(widen_as<T>(in, i));
}

void convert_block(DType from, const std::uint8_t* in, float* out, std::uint64_t n) {
    if (from == DType::u8)
        widen_block<DType::u8>(in, out, n);
    else if (from == DType::bf16)
        widen_block<DType::bf16>(in, out, n);
    else
        widen_block<DType::f16>(in, out, n);
}

CaseResult convert_result(DType from, const std::vector<double>& seconds) {
    CaseResult r;
    r.params = {{"from", dtype_name(from)}, {"to", "f32"}, {"elements", convert_elements}};
    r.repetitions = static_cast<unsigned>(seconds.size());
    r.metrics["rate"] = rate_metric(double(convert_elements * 4), seconds, "B/s"); // f32 bytes written
    r.metrics["elements_rate"] = rate_metric(double(convert_elements), seconds, "elements/s");
    return r;
}

std::vector<CaseResult> run_convert_cpu(const CaseContext& ctx, DType from) {
    const auto in = convert_input(from, convert_elements, ctx.settings.seed);
    std::vector<float> out(convert_elements);
    const std::uint64_t block = 1ull << 16, blocks = convert_elements / block, esize = dtype_size(from);
    std::vector<CaseResult> results;
    for (unsigned threads : ctx.settings.threads) {
        ThreadPool pool(threads);
        auto pass = [&]() -> double {
            const double t0 = now_seconds();
            pool.parallel_for(threads, [&](std::uint64_t w) {
                for (std::uint64_t b = w; b < blocks; b += threads)
                    convert_block(from, in.data() + b * block * esize, out.data() + b * block, block);
            });
            return now_seconds() - t0;
        };
        CaseResult r = convert_result(from, time_repetitions(ctx.settings.repeat, {}, pass));
        r.variant = variant_threads(threads);
        r.params["threads"] = threads;
        results.push_back(std::move(r));
    }
    return results;
}

std::vector<CaseResult> run_convert_gpu(const CaseContext& ctx, DType from) {
    GpuConvertBench bench(from, convert_elements);
    const auto in = convert_input(from, convert_elements, ctx.settings.seed);
    bench.upload(in.data(), convert_elements);
    return {convert_result(from, time_repetitions(ctx.settings.repeat, {}, [&] { return bench.run(); }))};
}

} // namespace

void add_decode_cases(CaseRegistry& reg) {
    Case z;
    z.key = "decode.zstd";
    z.description = "zstd decompression of --chunk-size chunks of the file's first 64 MiB (compressed in memory at "
                    "--zstd-level), --threads sweep";
    z.waive = [](const CaseContext& ctx) -> std::optional<std::string> {
        if (auto why = needs_target(ctx)) return why;
        if (target_is_chunked(ctx)) return "the dataset is already zstd-chunked: decode.zstd.chunked times its chunks";
        return std::nullopt;
    };
    z.run = run_zstd;
    reg.add(std::move(z));

    Case zc;
    zc.key = "decode.zstd.chunked";
    zc.description = "ChunkedReader::read_chunk over the first --size bytes of a zstd-chunked dataset (warm page "
                     "cache), --threads sweep";
    zc.waive = [](const CaseContext& ctx) -> std::optional<std::string> {
        if (auto why = needs_target(ctx)) return why;
        if (!target_is_chunked(ctx)) return "needs a zstd-chunked dataset (dsconvert --compress zstd)";
        return std::nullopt;
    };
    zc.run = run_chunked;
    reg.add(std::move(zc));

    for (DType from : {DType::u8, DType::bf16, DType::f16}) {
        Case cpu;
        cpu.key = "decode.convert.cpu." + std::string(dtype_name(from));
        cpu.description = std::string(dtype_name(from)) + " -> f32 conversion on the CPU, 16M values, --threads sweep";
        cpu.waive = [](const CaseContext&) { return std::optional<std::string>{}; };
        cpu.run = [from](const CaseContext& ctx) { return run_convert_cpu(ctx, from); };
        reg.add(std::move(cpu));

        Case gpu;
        gpu.key = "decode.convert.gpu." + std::string(dtype_name(from));
        gpu.description = std::string(dtype_name(from)) + " -> f32 conversion kernel in GPU memory, 16M values";
        gpu.waive = [](const CaseContext&) { return gpu_unavailable(); };
        gpu.run = [from](const CaseContext& ctx) { return run_convert_gpu(ctx, from); };
        reg.add(std::move(gpu));
    }
}

} // namespace dstk::bench
