// A dataset directory as input.
#include "formats.hpp"

#include "dstk/field_reader.hpp"
#include "dstk/thread_pool.hpp"

namespace dstk::import {

// One field of a dataset directory, in one file or in parts (dsconvert
// --merge); chunked fields decode chunks on the pool.
class DatasetField final : public FieldStream {
  public:
    DatasetField(const fs::path& dir, const SplitInfo& split, const FieldInfo& field, ThreadPool& pool)
        : field_(open_field_reader(dir, split, field)), sample_bytes_(field.sample_bytes()), pool_(&pool) {}
    void read(std::uint64_t count, void* dst) override {
        field_->read(pos_, count, dst, pool_);
        pos_ += count;
    }
    void skip(std::uint64_t count) override { pos_ += count; }
    std::uint64_t sample_bytes() const override { return sample_bytes_; }

  private:
    std::unique_ptr<FieldReader> field_;
    std::uint64_t sample_bytes_, pos_ = 0;
    ThreadPool* pool_;
};

// ---- dataset directory --------------------------------------------------

Source open_dataset_dir(const fs::path& dir, ThreadPool& pool) {
    Source s;
    s.format = InputFormat::dataset;
    s.description = "dataset directory";
    s.manifest = load_manifest(dir);
    s.num_classes = s.manifest->num_classes;
    s.input_field = s.manifest->input_field;
    s.label_field = s.manifest->label_field;
    for (const SplitInfo& sp : s.manifest->splits) {
        SourceSplit split;
        split.name = sp.name;
        split.samples = sp.samples;
        for (const FieldInfo& fi : sp.fields) {
            SourceField f;
            f.name = fi.name;
            f.dtype = fi.dtype;
            f.shape = fi.shape;
            f.stream = std::make_unique<DatasetField>(dir, sp, fi, pool);
            split.fields.push_back(std::move(f));
        }
        s.splits.push_back(std::move(split));
    }
    return s;
}

} // namespace dstk::import
