// A dataset directory as input.
#include "formats.hpp"

#include "dstk/chunked_file.hpp"
#include "dstk/dataset.hpp"
#include "dstk/thread_pool.hpp"

namespace dstk::import {

// One field of a dataset directory; chunked fields decode chunks on the pool.
class DatasetField final : public FieldStream {
  public:
    DatasetField(std::shared_ptr<Dataset> d, const fs::path& dir, const SplitInfo& split, const FieldInfo& field,
                 ThreadPool& pool)
        : d_(std::move(d)), reader_(&d_->reader(split.name, field.name)), sample_bytes_(field.sample_bytes()),
          pool_(&pool) {
        if (field.storage == Storage::zstd_chunked) chunked_ = std::make_unique<ChunkedReader>(dir / field.file);
    }
    void read(std::uint64_t count, void* dst) override {
        if (chunked_)
            chunked_->read(pos_, count, dst, pool_);
        else
            reader_->read(pos_, count, dst);
        pos_ += count;
    }
    void skip(std::uint64_t count) override { pos_ += count; }
    std::uint64_t sample_bytes() const override { return sample_bytes_; }

  private:
    std::shared_ptr<Dataset> d_;
    const FieldReader* reader_;
    std::unique_ptr<ChunkedReader> chunked_;
    std::uint64_t sample_bytes_, pos_ = 0;
    ThreadPool* pool_;
};

// ---- dataset directory --------------------------------------------------

Source open_dataset_dir(const fs::path& dir, ThreadPool& pool) {
    auto d = std::make_shared<Dataset>(Dataset::open(dir));
    Source s;
    s.format = InputFormat::dataset;
    s.description = "dataset directory";
    s.manifest = d->manifest();
    s.num_classes = d->manifest().num_classes;
    for (const SplitInfo& sp : d->manifest().splits) {
        SourceSplit split;
        split.name = sp.name;
        split.samples = sp.samples;
        for (const FieldInfo& fi : sp.fields) {
            SourceField f;
            f.name = fi.name;
            f.dtype = fi.dtype;
            f.shape = fi.shape;
            f.stream = std::make_unique<DatasetField>(d, dir, sp, fi, pool);
            split.fields.push_back(std::move(f));
        }
        s.splits.push_back(std::move(split));
    }
    return s;
}

} // namespace dstk::import
