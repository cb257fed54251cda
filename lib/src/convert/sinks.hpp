#pragma once
// dsconvert's field sinks: where the converted samples of one field of one
// output split go (.npy or zstd-chunked dataset files, one .npy or raw file,
// or nowhere).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dstk/chunked_file.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/layout.hpp"
#include "dstk/manifest.hpp"

namespace dstk {
class ThreadPool;
}

namespace dstk::convert {

class FieldSink {
  public:
    virtual ~FieldSink() = default;
    virtual void append(const void* data, std::uint64_t count) = 0;
    virtual FieldInfo finish() = 0;
    // A sink that is the whole output (one .npy or raw file): the file,
    // finished but not yet in place (the run puts it there after its side files).
    virtual AtomicOutput* staged_output() { return nullptr; }
    // Samples a sink gathers before it writes (0: it writes as it goes).
    virtual std::uint64_t batch_samples() const { return 0; }
    virtual void limit_batch_samples(std::uint64_t) {}
};

// The fields of a split reach the disk together: a zstd-chunked label field
// (4-byte samples) would otherwise gather millions of samples per write while
// the images write every few thousand, and an interrupted run could resume
// only from the last point every field had written.
void align_batches(std::vector<std::unique_ptr<FieldSink>>& sinks);

class ChunkedSink final : public FieldSink {
  public:
    ChunkedSink(std::filesystem::path path, FieldInfo info, int level, ThreadPool& pool, std::uint64_t keep = 0)
        : info_(std::move(info)),
          w_(keep ? ChunkedWriter::resume(std::move(path), info_.sample_bytes(), info_.chunk_samples, level, pool, keep)
                  : ChunkedWriter(std::move(path), info_.sample_bytes(), info_.chunk_samples, level, pool)) {}
    void append(const void* data, std::uint64_t count) override { w_.append(data, count); }
    std::uint64_t batch_samples() const override { return w_.batch_samples(); }
    void limit_batch_samples(std::uint64_t samples) override { w_.limit_batch_samples(samples); }
    FieldInfo finish() override {
        info_.checksum = w_.finish();
        info_.bytes = w_.file_bytes();
        return info_;
    }

  private:
    FieldInfo info_;
    ChunkedWriter w_;
};

// The .npy header of `samples` samples of `shape`.
std::string npy_header_for(DType dtype, const Shape& shape, std::uint64_t samples);

std::unique_ptr<FieldSink> make_npy_sink(std::unique_ptr<NpyFieldWriter> writer);
// A dataset's .npy field file of unknown length (stdin): its header is fixed at finish().
std::unique_ptr<FieldSink> make_unknown_count_npy_sink(std::filesystem::path path, FieldInfo info);
// One .npy or raw file (sample-major, or feature-major for raw). With no
// known count (stdin), a .npy output gets its header at finish().
std::unique_ptr<FieldSink> make_file_sink(const std::filesystem::path& out, bool force, DType dtype, const Shape& shape,
                                          std::optional<std::uint64_t> samples, bool npy, Layout layout);
// Drops what it is given: fields and splits a single-file output leaves out.
std::unique_ptr<FieldSink> make_null_sink();

// Passes the samples on to `inner` and adds up their per-channel statistics
// (channel_stats.hpp) in rows of `row_samples` consecutive samples of the
// split, which finish() turns into the FieldInfo's stats where they are usable
// (else `notice` says why not). Rows at fixed sample positions make a --shard
// part's rows (kept in `rows`, when given) the whole run's, so that a merge
// adds them into the same statistics. A resumed sink (keep > 0 samples
// already in the file) reads those back from `dir` when it finishes.
struct StatsSinkSpec {
    std::string split;
    std::uint64_t split_samples = 0, keep = 0, row_samples = 1;
    std::filesystem::path dir;
    std::function<void(const std::string&)> notice;
    std::shared_ptr<std::vector<std::vector<double>>> rows;
};
std::unique_ptr<FieldSink> make_stats_sink(std::unique_ptr<FieldSink> inner, DType dtype, const Shape& shape,
                                           StatsSinkSpec spec);

} // namespace dstk::convert
