// dsconvert --benchmark: the speed of the conversion kernels and of zstd chunk
// compression on their own, in memory, per core and on all cores, so they can
// be compared with the targets and with `zstd -b` on the same bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/convert/bench.hpp"
#include "dstk/convert/dtype_kernels.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/rng.hpp"
#include "dstk/signals.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

constexpr std::uint64_t kernel_elements = 16ull << 20;
constexpr std::uint64_t kernel_grain = 1ull << 16; // as the conversion pipeline's tasks
constexpr std::uint64_t zstd_max_input = 256ull << 20;
constexpr int kernel_repeats = 5, zstd_repeats = 2;

struct Row {
    std::string name;
    unsigned threads = 1;
    std::uint64_t bytes_in = 0, bytes_out = 0;
    double seconds = 0;
    double cpu_seconds = 0; // process CPU time of the same (best) run: all threads
};

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_now() {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Timing {
    double wall = 1e300, cpu = 1e300;
};

// Best wall time and best CPU time of `repeats` runs. On a shared machine the
// CPU time is the steadier per-core figure: other processes stretch the wall
// clock, not the cycles this process spends.
template <class F> Timing best_of(int repeats, F&& f) {
    Timing best;
    for (int r = 0; r < repeats; ++r) {
        throw_if_interrupted();
        const double t0 = now(), c0 = cpu_now();
        f();
        best.wall = std::min(best.wall, now() - t0);
        best.cpu = std::min(best.cpu, cpu_now() - c0);
    }
    return best;
}

// Converts `n` elements in pipeline-sized tasks, on the calling thread or the pool.
void convert_all(DType from, DType to, const std::uint8_t* in, std::uint8_t* out, std::uint64_t n,
                 const ValueMapping& map, ThreadPool* pool) {
    const std::uint64_t tasks = (n + kernel_grain - 1) / kernel_grain;
    const std::size_t ei = dtype_size(from), eo = dtype_size(to);
    auto one = [&](std::uint64_t t) {
        ConversionStats s;
        const std::uint64_t a = t * kernel_grain, b = std::min(n, a + kernel_grain);
        convert_elements(from, to, in + a * ei, out + a * eo, b - a, map, s);
    };
    if (pool)
        pool->parallel_for(tasks, one);
    else
        for (std::uint64_t t = 0; t < tasks; ++t) one(t);
}

void kernel_rows(std::vector<Row>& rows, ThreadPool& pool) {
    SplitMix64 rng(42);
    std::vector<float> f32(kernel_elements);
    for (auto& v : f32) v = static_cast<float>(static_cast<double>(rng.next() >> 11) * 0x1p-53 * 8.0 - 4.0);
    std::vector<std::uint8_t> u8(kernel_elements);
    for (auto& v : u8) v = static_cast<std::uint8_t>(rng.next() >> 56);
    std::vector<std::uint8_t> out(kernel_elements * 4);
    struct Case {
        const char* name;
        DType from, to;
        const std::uint8_t* in;
        ValueMapping map;
    };
    const Case cases[] = {
        {"kernel f32 -> bf16", DType::f32, DType::bf16, reinterpret_cast<const std::uint8_t*>(f32.data()), {}},
        {"kernel f32 -> f16", DType::f32, DType::f16, reinterpret_cast<const std::uint8_t*>(f32.data()), {}},
        {"kernel u8 -> f32 (scale 1/255)", DType::u8, DType::f32, u8.data(), {1.0 / 255, 0}},
        {"kernel u8 -> bf16 (scale 1/255)", DType::u8, DType::bf16, u8.data(), {1.0 / 255, 0}},
    };
    for (unsigned threads : {1u, pool.size()}) {
        if (threads != 1 && threads == pool.size() && pool.size() == 1) break;
        for (const Case& c : cases) {
            const Timing t = best_of(kernel_repeats, [&] {
                convert_all(c.from, c.to, c.in, out.data(), kernel_elements, c.map, threads == 1 ? nullptr : &pool);
            });
            rows.push_back({c.name, threads, kernel_elements * dtype_size(c.from), kernel_elements * dtype_size(c.to),
                            t.wall, t.cpu});
        }
    }
}

void zstd_rows(std::vector<Row>& rows, const ConvertOptions& o, ThreadPool& pool) {
    const UniqueFd fd = open_input_file(o.input, "input");
    const off_t size = ::lseek(fd.get(), 0, SEEK_END);
    std::vector<std::uint8_t> data(std::min<std::uint64_t>(size < 0 ? 0 : size, zstd_max_input));
    read_all(fd.get(), data.data(), data.size(), 0, o.input);
    if (data.empty()) throw usage_error("--benchmark: '" + o.input.string() + "' is empty");
    std::vector<int> levels{1, 3};
    if (o.compress != "none") {
        const auto colon = o.compress.find(':');
        levels = {colon == std::string::npos ? chunked_default_level : std::stoi(o.compress.substr(colon + 1))};
    }
    const std::uint64_t chunk = o.chunk_bytes ? o.chunk_bytes : chunked_default_chunk_bytes;
    const fs::path tmp = fs::temp_directory_path() / ("dsconvert-benchmark-" + std::to_string(::getpid()) + ".zst");
    register_temp_path(tmp);
    std::vector<std::uint8_t> back(data.size());
    ThreadPool one(1);
    try {
        for (int level : levels) {
            const std::string name = "zstd:" + std::to_string(level);
            for (ThreadPool* p : {&one, &pool}) {
                if (p == &pool && pool.size() == 1) break;
                std::uint64_t compressed = 0;
                const Timing c = best_of(zstd_repeats, [&] {
                    ChunkedWriter w(tmp, 1, chunk, level, *p);
                    w.append(data.data(), data.size());
                    w.finish();
                    compressed = w.file_bytes();
                });
                rows.push_back({name + " compress", p->size(), data.size(), compressed, c.wall, c.cpu});
                const ChunkedReader r(tmp);
                const Timing d = best_of(zstd_repeats, [&] { r.read(0, r.samples(), back.data(), p); });
                if (back != data) throw runtime_error("--benchmark: zstd round trip differs (internal error)");
                rows.push_back({name + " decompress", p->size(), compressed, data.size(), d.wall, d.cpu});
            }
        }
    } catch (...) {
        ::unlink(tmp.c_str());
        unregister_temp_path(tmp);
        throw;
    }
    ::unlink(tmp.c_str());
    unregister_temp_path(tmp);
}

} // namespace

void run_convert_benchmark(const ConvertOptions& o) {
    ThreadPool pool(o.threads);
    std::vector<Row> rows;
    kernel_rows(rows, pool);
    if (!o.input.empty()) zstd_rows(rows, o, pool);
    if (o.out.json) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows)
            j.push_back({{"case", r.name},
                         {"threads", r.threads},
                         {"bytes_in", r.bytes_in},
                         {"bytes_out", r.bytes_out},
                         {"seconds", r.seconds},
                         {"cpu_seconds", r.cpu_seconds},
                         {"in_mb_per_s", r.bytes_in / r.seconds / 1e6},
                         {"out_mb_per_s", r.bytes_out / r.seconds / 1e6},
                         {"in_mb_per_cpu_s", r.bytes_in / r.cpu_seconds / 1e6},
                         {"out_mb_per_cpu_s", r.bytes_out / r.cpu_seconds / 1e6}});
        std::printf("%s\n", nlohmann::json{{"input", o.input.string()}, {"results", j}}.dump(2).c_str());
        return;
    }
    std::printf("%-34s %7s %12s %12s %14s %14s\n", "case", "threads", "in MB/s", "out MB/s", "in MB/cpu-s",
                "out MB/cpu-s");
    for (const Row& r : rows)
        std::printf("%-34s %7u %12.0f %12.0f %14.0f %14.0f\n", r.name.c_str(), r.threads, r.bytes_in / r.seconds / 1e6,
                    r.bytes_out / r.seconds / 1e6, r.bytes_in / r.cpu_seconds / 1e6, r.bytes_out / r.cpu_seconds / 1e6);
    if (!o.input.empty())
        std::printf("(zstd rows: %s, first %s, %s chunks; compress in = uncompressed bytes, decompress out = "
                    "uncompressed bytes)\n",
                    o.input.string().c_str(),
                    format_bytes(std::min<std::uint64_t>(fs::file_size(o.input), zstd_max_input)).c_str(),
                    format_bytes(o.chunk_bytes ? o.chunk_bytes : chunked_default_chunk_bytes).c_str());
}

} // namespace dstk
