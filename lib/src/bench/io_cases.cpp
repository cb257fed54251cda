// I/O cases: sequential reads (pread, O_DIRECT, mmap) and random reads at
// sample, batch and chunk granularity (pread, mmap), from a cold or warm page cache.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "dstk/bench/case.hpp"
#include "dstk/bench/page_cache.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"
#include "dstk/signals.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/fd.hpp"
#include "dstk/units.hpp"

namespace dstk::bench {
namespace {

constexpr std::uint64_t direct_align = 4096;

class File {
  public:
    File(const std::filesystem::path& p, int flags) : path_(p), fd_(UniqueFd::open(p, flags, "cannot open")) {}
    int fd() const { return fd_.get(); }

    // Reads exactly `len` bytes at `offset` (fewer only at the end of the file).
    void read(void* dst, std::uint64_t len, std::uint64_t offset) const {
        auto* p = static_cast<char*>(dst);
        while (len > 0) {
            const ssize_t n = ::pread(fd_.get(), p, len, static_cast<off_t>(offset));
            if (n < 0) {
                if (errno == EINTR) continue;
                throw_errno("cannot read", path_.string());
            }
            if (n == 0) return;
            p += n, len -= std::uint64_t(n), offset += std::uint64_t(n);
        }
    }

  private:
    std::filesystem::path path_;
    UniqueFd fd_;
};

class Mapping {
  public:
    Mapping(const std::filesystem::path& p, std::uint64_t bytes, int advice) : bytes_(bytes) {
        File f(p, O_RDONLY);
        addr_ = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, f.fd(), 0);
        if (addr_ == MAP_FAILED) throw_errno("cannot map", p.string());
        ::madvise(addr_, bytes, advice);
    }
    ~Mapping() { ::munmap(addr_, bytes_); }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    const char* data() const { return static_cast<const char*>(addr_); }

  private:
    void* addr_;
    std::uint64_t bytes_;
};

struct AlignedBuffer {
    explicit AlignedBuffer(std::uint64_t bytes) {
        if (::posix_memalign(&p, direct_align, std::max<std::uint64_t>(bytes, direct_align)) != 0)
            throw std::bad_alloc();
        std::memset(p, 0, bytes);
    }
    ~AlignedBuffer() { std::free(p); }
    AlignedBuffer(const AlignedBuffer&) = delete;
    AlignedBuffer& operator=(const AlignedBuffer&) = delete;
    char* data() const { return static_cast<char*>(p); }
    void* p = nullptr;
};

enum class Method { pread, direct, mmap };
enum class Cache { cold, warm };
enum class Grain { sample, batch, chunk };

// The names in the cases' keys and their results' params.
constexpr EnumNames<Method, 3> method_names{
    {{{Method::pread, "pread"}, {Method::direct, "direct"}, {Method::mmap, "mmap"}}}};
constexpr EnumNames<Cache, 2> cache_names{{{{Cache::cold, "cold"}, {Cache::warm, "warm"}}}};
constexpr EnumNames<Grain, 3> grain_names{
    {{{Grain::sample, "sample"}, {Grain::batch, "batch"}, {Grain::chunk, "chunk"}}}};

// Cold cases drop the file's pages before each repetition, and record how
// much of the region was still resident afterwards (the proof of coldness).
struct Cooler {
    const Target& target;
    const Settings& settings;
    std::uint64_t region;
    std::string method;
    double max_resident = 0;

    void operator()() {
        method = drop_file_cache(target.file, settings.drop_caches);
        max_resident = std::max(max_resident, resident_fraction(target.file, 0, region));
    }
    void record(CaseResult& r) const {
        r.params["cold_method"] = method;
        r.params["resident_after_drop_pct"] = 100 * max_resident;
    }
};

std::optional<std::string> waive_io(const CaseContext& ctx, Cache cache, std::uint64_t region) {
    if (auto why = needs_target(ctx)) return why;
    if (cache == Cache::cold) return cold_cache_unsupported(ctx.target->file, ctx.settings.drop_caches);
    const std::uint64_t available = detect_system().memory.available;
    if (available > 0 && region > available / 2)
        return "the region read (" + format_bytes(region) + ") does not fit in half the available RAM (" +
               format_bytes(available) + "): warm reads would not be warm; use --size";
    return std::nullopt;
}

std::uint64_t seq_region(const CaseContext& ctx, Method m) {
    std::uint64_t r = std::min(ctx.settings.size_bytes, ctx.target->file_bytes);
    if (m == Method::direct) r = r / direct_align * direct_align;
    return r;
}

std::uint64_t seq_block(const Settings& s, Method m) {
    return m == Method::direct ? (s.block_bytes + direct_align - 1) / direct_align * direct_align : s.block_bytes;
}

std::vector<CaseResult> run_sequential(const CaseContext& ctx, Method method, Cache cache) {
    const Target& t = *ctx.target;
    const std::uint64_t region = seq_region(ctx, method);
    if (region == 0) throw runtime_error(t.file.string() + ": too small for an O_DIRECT read (under 4 KiB)");
    const std::uint64_t block = seq_block(ctx.settings, method);
    AlignedBuffer buf(block);
    Cooler cooler{t, ctx.settings, region, {}};
    std::function<void()> prepare;
    if (cache == Cache::cold) prepare = std::ref(cooler);

    std::unique_ptr<File> file;
    if (method == Method::pread) {
        file = std::make_unique<File>(t.file, O_RDONLY);
        ::posix_fadvise(file->fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
    } else if (method == Method::direct) {
        file = std::make_unique<File>(t.file, O_RDONLY | O_DIRECT);
    }
    auto pass = [&]() -> double {
        const double t0 = now_seconds();
        if (method == Method::mmap) {
            const Mapping map(t.file, region, MADV_SEQUENTIAL);
            for (std::uint64_t off = 0; off < region; off += block) {
                if ((off & ((64ull << 20) - 1)) == 0) throw_if_interrupted();
                std::memcpy(buf.data(), map.data() + off, std::min(block, region - off));
            }
        } else {
            for (std::uint64_t off = 0; off < region; off += block) {
                if ((off & ((64ull << 20) - 1)) == 0) throw_if_interrupted();
                file->read(buf.data(), std::min(block, region - off), off);
            }
        }
        return now_seconds() - t0;
    };
    const auto seconds = time_repetitions(ctx.settings.repeat, prepare, pass);
    CaseResult r;
    r.params = {
        {"bytes_per_repetition", region}, {"block_bytes", block}, {"threads", 1}, {"cache", cache_names.name(cache)}};
    if (cache == Cache::cold) cooler.record(r);
    r.repetitions = static_cast<unsigned>(seconds.size());
    r.metrics["rate"] = rate_metric(double(region), seconds, "B/s");
    r.metrics["samples_rate"] = rate_metric(double(region) / double(t.sample_bytes), seconds, "samples/s");
    return {r};
}

std::uint64_t grain_bytes(const CaseContext& ctx, Grain g) {
    const Target& t = *ctx.target;
    std::uint64_t b = t.sample_bytes;
    if (g == Grain::batch) b = t.sample_bytes * std::max<std::uint64_t>(1, ctx.settings.batch_samples);
    if (g == Grain::chunk) b = std::max(t.sample_bytes, ctx.settings.chunk_bytes / t.sample_bytes * t.sample_bytes);
    return std::min(b, t.data_bytes / t.sample_bytes * t.sample_bytes);
}

// `count` random positions in [0, positions), in random order, none repeated
// while count <= positions (then every position, dealt again in a new order).
// A loader's epoch reads each chunk once: a pass that drew with replacement
// would re-read some of what it just read, and a cold pass would then time
// page-cache hits as disk reads (a quarter of a pass of 8 GiB over 14 GiB).
std::vector<std::uint64_t> distinct_positions(std::uint64_t seed, std::uint64_t positions, std::uint64_t count) {
    SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull);
    const std::uint64_t k = std::min(count, positions);
    std::vector<std::uint64_t> out;
    if (k == 0) return out;
    out.reserve(count);
    std::unordered_set<std::uint64_t> taken; // Floyd's sampling: k draws, each a new position
    for (std::uint64_t j = positions - k; j < positions; ++j) {
        const std::uint64_t r = rng.next() % (j + 1);
        out.push_back(taken.contains(r) ? j : r);
        taken.insert(out.back());
    }
    while (out.size() < count) out.push_back(out[out.size() - k]);
    for (std::size_t i = out.size(); i > 1; --i) std::swap(out[i - 1], out[rng.next() % i]);
    return out;
}

// The reads of one random-read pass: their size, how many, from how many
// start positions.
struct RandomPass {
    std::uint64_t grain_op = 0;  // bytes of samples a read wants
    std::uint64_t op_bytes = 0;  // bytes a read reads (O_DIRECT: whole 4 KiB blocks)
    std::uint64_t ops_total = 0; // reads a pass, over all threads
    std::uint64_t positions = 0; // start samples or chunks to draw from
};

RandomPass plan_random(const CaseContext& ctx, Method method, Grain grain) {
    const Target& t = *ctx.target;
    RandomPass p;
    // O_DIRECT reads whole aligned blocks: a chunk rounded up to them, from
    // aligned offsets (the chunk's start rounded down).
    p.grain_op = grain_bytes(ctx, grain);
    p.op_bytes = method == Method::direct ? (p.grain_op + direct_align - 1) / direct_align * direct_align : p.grain_op;
    if (p.op_bytes == 0) throw runtime_error(t.file.string() + ": holds less than one sample");
    // Enough reads for a stable figure, few enough that a cold pass stays short.
    // Chunk reads are what a training epoch streams for seconds on end: they
    // read --size bytes a pass, so that a disk whose short bursts outrun its
    // sustained rate is timed at the rate an epoch gets.
    const std::uint64_t pass_bytes =
        grain == Grain::chunk ? std::min(ctx.settings.size_bytes, t.data_bytes) : std::uint64_t{128} << 20;
    // A chunk pass makes all of its --size (a whole epoch's chunks, each once,
    // where --size covers the data): a pass that fills the page cache's share of
    // a memory cgroup times the reclaim that a long run of buffered reads pays.
    const std::uint64_t most = grain == Grain::chunk ? std::max<std::uint64_t>(2048, pass_bytes / p.op_bytes) : 2048;
    p.ops_total = std::clamp<std::uint64_t>(pass_bytes / p.op_bytes, 64, most);
    p.positions = grain == Grain::chunk ? t.data_bytes / p.op_bytes : t.samples() - p.op_bytes / t.sample_bytes + 1;
    return p;
}

std::vector<CaseResult> run_random(const CaseContext& ctx, Method method, Cache cache, Grain grain) {
    const Target& t = *ctx.target;
    const RandomPass pass_plan = plan_random(ctx, method, grain);
    // Plain names, not a structured binding: lambdas below capture them.
    const std::uint64_t grain_op = pass_plan.grain_op, op_bytes = pass_plan.op_bytes;
    const std::uint64_t ops_total = pass_plan.ops_total, positions = pass_plan.positions;
    std::vector<CaseResult> results;
    for (unsigned threads : ctx.settings.threads) {
        const std::uint64_t per_thread = std::max<std::uint64_t>(8, (ops_total + threads - 1) / threads);
        // The same offsets every repetition: a warm pass re-reads what the warm-up cached.
        std::vector<std::vector<std::uint64_t>> offsets(threads);
        const std::vector<std::uint64_t> drawn = distinct_positions(ctx.settings.seed, positions, per_thread * threads);
        for (unsigned i = 0; i < threads; ++i)
            for (std::uint64_t k = 0; k < per_thread; ++k) {
                const std::uint64_t pos = drawn[i * per_thread + k];
                const std::uint64_t at = t.data_offset + pos * (grain == Grain::chunk ? grain_op : t.sample_bytes);
                offsets[i].push_back(method == Method::direct ? at / direct_align * direct_align : at);
            }
        std::vector<std::unique_ptr<AlignedBuffer>> bufs;
        for (unsigned i = 0; i < threads; ++i) bufs.push_back(std::make_unique<AlignedBuffer>(op_bytes));
        std::vector<std::vector<double>> lat(threads, std::vector<double>(per_thread));
        std::vector<std::vector<double>> rep_latencies; // per repetition, microseconds
        Cooler cooler{t, ctx.settings, t.file_bytes, {}};
        std::function<void()> prepare;
        if (cache == Cache::cold && method != Method::direct) prepare = std::ref(cooler); // O_DIRECT: no cache
        ThreadPool pool(threads);
        std::unique_ptr<File> file;
        if (method == Method::pread) {
            file = std::make_unique<File>(t.file, O_RDONLY);
            ::posix_fadvise(file->fd(), 0, 0, POSIX_FADV_RANDOM);
        } else if (method == Method::direct) {
            file = std::make_unique<File>(t.file, O_RDONLY | O_DIRECT);
        }
        auto pass = [&]() -> double {
            std::unique_ptr<Mapping> map;
            if (method == Method::mmap) map = std::make_unique<Mapping>(t.file, t.file_bytes, MADV_RANDOM);
            const double t0 = now_seconds();
            pool.parallel_for(threads, [&](std::uint64_t i) {
                char* dst = bufs[i]->data();
                for (std::uint64_t k = 0; k < per_thread; ++k) {
                    if ((k & 63) == 0 && interrupted()) return;
                    const double s = now_seconds();
                    if (map)
                        std::memcpy(dst, map->data() + offsets[i][k], op_bytes);
                    else
                        file->read(dst, op_bytes, offsets[i][k]);
                    lat[i][k] = (now_seconds() - s) * 1e6;
                }
            });
            const double elapsed = now_seconds() - t0;
            throw_if_interrupted();
            std::vector<double> all;
            for (const auto& l : lat) all.insert(all.end(), l.begin(), l.end());
            rep_latencies.push_back(std::move(all));
            return elapsed;
        };
        const auto seconds = time_repetitions(ctx.settings.repeat, prepare, pass);
        rep_latencies.erase(rep_latencies.begin()); // the warm-up
        CaseResult r;
        r.variant = variant_threads(threads);
        const std::uint64_t bytes = op_bytes * per_thread * threads;
        r.params = {{"threads", threads},
                    {"read_bytes", op_bytes},
                    {"reads_per_repetition", per_thread * threads},
                    {"distinct_reads", std::unordered_set<std::uint64_t>(drawn.begin(), drawn.end()).size()},
                    {"granularity", grain_names.name(grain)},
                    {"cache", cache_names.name(cache)}};
        if (cache == Cache::cold && method != Method::direct) cooler.record(r);
        r.repetitions = static_cast<unsigned>(seconds.size());
        r.metrics["rate"] = rate_metric(double(bytes), seconds, "B/s");
        r.metrics["ops_rate"] = rate_metric(double(per_thread * threads), seconds, "ops/s");
        r.metrics["samples_rate"] = rate_metric(double(bytes / t.sample_bytes), seconds, "samples/s");
        for (const auto& [name, p] : {std::pair{"latency_p50", 50.0}, std::pair{"latency_p99", 99.0}}) {
            std::vector<double> pooled, per_rep;
            for (const auto& l : rep_latencies) {
                pooled.insert(pooled.end(), l.begin(), l.end());
                per_rep.push_back(percentile(l, p));
            }
            Metric m = summarize(per_rep, "us");
            m.median = percentile(pooled, p);
            r.metrics[name] = m;
        }
        results.push_back(std::move(r));
    }
    return results;
}

std::optional<std::string> direct_unsupported(const CaseContext& ctx) {
    if (auto why = needs_target(ctx)) return why;
    const UniqueFd fd = UniqueFd::try_open(ctx.target->file, O_RDONLY | O_DIRECT);
    if (!fd) {
        const int err = errno;
        const DiskInfo d = disk_info(ctx.target->file);
        return "O_DIRECT is not supported " + (d.filesystem.empty() ? std::string("here") : "on " + d.filesystem) +
               " (" + std::strerror(err) + ")";
    }
    AlignedBuffer buf(direct_align);
    const ssize_t n = ::pread(fd.get(), buf.data(), direct_align, 0);
    const int err = errno;
    if (n < 0) return std::string("O_DIRECT reads fail on this file (") + std::strerror(err) + ")";
    if (ctx.target->file_bytes < direct_align) return "the file is smaller than one O_DIRECT block (4 KiB)";
    return std::nullopt;
}

} // namespace

void add_io_cases(CaseRegistry& reg) {
    struct Seq {
        const char* key;
        Method method;
        Cache cache;
        const char* what;
    };
    for (const Seq& s :
         {Seq{"io.seq.pread.cold", Method::pread, Cache::cold, "sequential pread, cold page cache"},
          Seq{"io.seq.pread.warm", Method::pread, Cache::warm, "sequential pread, warm page cache"},
          Seq{"io.seq.direct", Method::direct, Cache::cold, "sequential pread with O_DIRECT"},
          Seq{"io.seq.mmap.cold", Method::mmap, Cache::cold, "sequential copy out of mmap + madvise(SEQUENTIAL), cold"},
          Seq{"io.seq.mmap.warm", Method::mmap, Cache::warm,
              "sequential copy out of mmap + madvise(SEQUENTIAL), warm"}}) {
        Case c;
        c.key = s.key;
        c.description = std::string(s.what) + ", --block-size reads of the first --size bytes, one thread";
        c.waive = [s](const CaseContext& ctx) -> std::optional<std::string> {
            if (s.method == Method::direct) return direct_unsupported(ctx);
            if (auto why = needs_target(ctx)) return why;
            return waive_io(ctx, s.cache, seq_region(ctx, s.method));
        };
        c.run = [s](const CaseContext& ctx) { return run_sequential(ctx, s.method, s.cache); };
        reg.add(std::move(c));
    }
    for (Grain g : {Grain::sample, Grain::batch, Grain::chunk})
        for (Method m : {Method::pread, Method::mmap})
            for (Cache cache : {Cache::cold, Cache::warm}) {
                Case c;
                const std::string grain(grain_names.name(g)), cached(cache_names.name(cache));
                c.key = "io.rand." + grain + "." + std::string(method_names.name(m)) + "." + cached;
                c.description = "random " + grain + " reads with " +
                                (m == Method::pread ? "pread + fadvise(RANDOM)" : "mmap + madvise(RANDOM)") + ", " +
                                cached + " page cache, --threads sweep";
                c.in_default = cache == Cache::cold || g == Grain::sample;
                c.waive = [cache](const CaseContext& ctx) -> std::optional<std::string> {
                    if (auto why = needs_target(ctx)) return why;
                    if (ctx.target->samples() == 0) return "the file holds less than one sample";
                    // A warm pass re-reads the offsets of the warm-up: at most a few hundred MiB.
                    return waive_io(ctx, cache, std::min<std::uint64_t>(ctx.target->file_bytes, 256ull << 20));
                };
                c.run = [m, cache, g](const CaseContext& ctx) { return run_random(ctx, m, cache, g); };
                reg.add(std::move(c));
            }
    {
        // What a streaming loader reading with O_DIRECT (dstrain, dstk.Loader)
        // gets from the disk: its chunk reads bypass the page cache.
        Case c;
        c.key = "io.rand.chunk.direct";
        c.description = "random chunk reads with O_DIRECT (aligned, rounded up to 4 KiB blocks), --threads sweep";
        c.in_default = false; // named with --cases: the pread cases are the default set's chunk reads
        c.waive = [](const CaseContext& ctx) -> std::optional<std::string> {
            if (auto why = direct_unsupported(ctx)) return why;
            if (ctx.target->data_bytes < grain_bytes(ctx, Grain::chunk) + direct_align)
                return "the file holds less than one chunk and a 4 KiB block";
            return std::nullopt;
        };
        c.run = [](const CaseContext& ctx) { return run_random(ctx, Method::direct, Cache::cold, Grain::chunk); };
        reg.add(std::move(c));
    }
}

} // namespace dstk::bench
