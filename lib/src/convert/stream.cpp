// The stream: three stages overlap. The next block is read on its own
// thread, this one is converted on the pool, and the previous one goes
// through the router to the sinks (.npy writes, the copy into the zstd
// writer, shuffle buckets) on another thread. Three input slots and two
// conversion buffers keep the stages apart.
#include <functional>
#include <future>

#include "convert_job.hpp"
#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"
#include "dstk/output.hpp"
#include "dstk/signals.hpp"
#include "shuffle.hpp"

namespace dstk::convert {
namespace {

using Buffers = std::vector<std::vector<std::uint8_t>>;
using Emit = std::function<void(const std::vector<const std::uint8_t*>&, std::uint64_t)>;

class Streamer {
  public:
    Streamer(Job& j, Progress& progress) : j_(j), progress_(progress), to_skip_(j.resume_at) {
        std::uint64_t per_sample = 0;
        for (const auto& p : j.fields) per_sample += p.in_bytes + p.out_bytes;
        block_ = std::max<std::uint64_t>(1, block_target_bytes / std::max<std::uint64_t>(1, per_sample));
        for (auto& s : in_slots_) s.resize(j.fields.size());
        for (auto& c : conv_) c.resize(j.fields.size());
    }
    std::uint64_t block() const { return block_; }

    void process_split(SourceSplit& sp, const Emit& emit) {
        const std::uint64_t skip = std::min(to_skip_, sp.samples);
        if (skip > 0) {
            for (auto& f : sp.fields) f.stream->skip(skip);
            to_skip_ -= skip;
            progress_.add(skip, 0);
        }
        const bool known = sp.count_known;
        auto want = [&](std::uint64_t at) { return known ? std::min(block_, sp.samples - at) : block_; };
        // Declared before `writing`, destroyed after it: a pending write never outlives its buffers.
        std::future<std::uint64_t> next;
        std::future<void> writing;
        int slot = 0, cslot = 0;
        std::uint64_t at = skip;
        auto read_next = [&](int s) {
            next = std::async(std::launch::async, [this, &sp, s, n = want(at)] { return read_into(sp, s, n); });
        };
        if (!known || at < sp.samples) read_next(0);
        while (next.valid()) {
            throw_if_interrupted();
            const std::uint64_t n = next.get();
            if (n == 0) break;
            const int cur = slot;
            slot = (slot + 1) % 3;
            at += n;
            if (!known || at < sp.samples) read_next(slot);
            std::vector<const std::uint8_t*> ptrs = convert(in_slots_[cur], conv_[cslot], n);
            cslot ^= 1;
            if (writing.valid()) writing.get(); // the previous block is out: its buffers are free
            writing = std::async(std::launch::async, [&emit, ptrs = std::move(ptrs), n] { emit(ptrs, n); });
            std::uint64_t in_bytes = 0;
            for (const auto& f : j_.fields) in_bytes += n * f.in_bytes;
            progress_.add(n, in_bytes); // input bytes: the rate shown is the conversion's
        }
        if (writing.valid()) writing.get();
        if (!known) {
            sp.samples = at;
            sp.count_known = true;
        }
        for (auto& f : sp.fields) f.stream->expect_end();
    }

  private:
    // Reads up to n samples of every field into a slot; returns how many
    // (fewer only at the end of a stream of unknown length, which has one field).
    std::uint64_t read_into(SourceSplit& sp, int slot, std::uint64_t n) {
        Buffers& in = in_slots_[slot];
        if (!sp.count_known) {
            in[0].resize(n * j_.fields[0].in_bytes);
            n = sp.fields[0].stream->read_up_to(n, in[0].data());
            in[0].resize(n * j_.fields[0].in_bytes);
            return n;
        }
        for (std::size_t f = 0; f < j_.fields.size(); ++f) {
            in[f].resize(n * j_.fields[f].in_bytes);
            sp.fields[f].stream->read(n, in[f].data());
        }
        return n;
    }

    // Converts a block; returns where each field's output is.
    std::vector<const std::uint8_t*> convert(const Buffers& in, Buffers& out, std::uint64_t n) {
        convert_block(j_.fields, in, out, n, j_.pool);
        std::vector<const std::uint8_t*> ptrs(j_.fields.size());
        for (std::size_t f = 0; f < j_.fields.size(); ++f) {
            FieldPlan& p = j_.fields[f];
            if (!p.convert) {
                p.stats.elements += n * p.shape.numel();
                p.stats.bytes_in += n * p.in_bytes;
                p.stats.bytes_out += n * p.out_bytes;
            }
            ptrs[f] = p.convert ? out[f].data() : in[f].data();
            if (p.label) finite_range(p.in, in[f].data(), n, p.label_lo, p.label_hi);
        }
        return ptrs;
    }

    Job& j_;
    Progress& progress_;
    std::uint64_t to_skip_, block_ = 1;
    Buffers in_slots_[3];
    Buffers conv_[2];
};

} // namespace

std::optional<std::uint32_t> check_labels(const Job& j) {
    for (const FieldPlan& p : j.fields) {
        if (!p.label || p.label_lo > p.label_hi) continue;
        const std::string what =
            j.o.input.string() + ": labels ('" + p.name + "', " + std::string(dtype_name(p.in)) + ")";
        if (p.label_lo < 0)
            throw runtime_error(what + " include " + std::to_string(static_cast<long long>(p.label_lo)) +
                                " (class labels are indices 0 .. N-1); shift them with numpy before converting");
        if (p.label_hi > 2147483646.0)
            throw runtime_error(what + " reach " + std::to_string(static_cast<long long>(p.label_hi)) +
                                ", beyond the i32 they are stored as (class labels are indices 0 .. N-1)");
        const auto top = static_cast<std::uint32_t>(p.label_hi);
        if (j.o.num_classes && top >= *j.o.num_classes)
            throw usage_error("--num-classes " + std::to_string(*j.o.num_classes) + " is too small: " + what +
                              " reach " + std::to_string(top) + "; give at least " + std::to_string(top + 1));
        return j.o.num_classes.value_or(top + 1);
    }
    return j.o.num_classes;
}

void stream_input(Job& j) {
    Progress progress("converting", j.count_known ? j.total_samples : 0, 0, j.o.out);
    Streamer streamer(j, progress);
    std::vector<OutSplit*> out_ptrs;
    for (auto& s : j.outs) out_ptrs.push_back(&s);
    Router router(out_ptrs, j.fields);
    const Emit to_router = [&](const auto& d, std::uint64_t n) { router.route(d, n); };
    if (j.resumable) {
        // Say where the work is kept before run_tool reports the interruption.
        try {
            for (auto& sp : j.src.splits) streamer.process_split(sp, to_router);
        } catch (const Error& e) {
            if (e.code() == ExitCode::interrupted || e.code() == ExitCode::failure)
                warning("partial conversion kept in '" + j.resumable->dir().string() +
                        "'; run the same command with --resume to continue after its last complete chunk");
            throw;
        }
    } else if (j.o.shuffle_seed) {
        std::optional<AtomicDir> scratch;
        std::filesystem::path bucket_dir = j.out_dir;
        if (!j.writer) {
            scratch.emplace(j.o.output.string() + ".shuffle", true);
            bucket_dir = scratch->tmp_path();
        }
        Shuffler sh(bucket_dir, *j.o.shuffle_seed, j.total_samples, j.fields);
        for (auto& sp : j.src.splits) streamer.process_split(sp, [&](const auto& d, std::uint64_t n) { sh.add(d, n); });
        sh.drain(router, streamer.block());
    } else {
        for (auto& sp : j.src.splits) streamer.process_split(sp, to_router);
    }
    progress.finish();
}

} // namespace dstk::convert
