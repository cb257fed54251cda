// CIFAR-10 binary batches.
#include "formats.hpp"

namespace dstk::import {

// CIFAR-10 records across batch files: either the label (as i32) or the pixels.
class CifarField final : public FieldStream {
  public:
    CifarField(std::vector<std::shared_ptr<File>> files, bool labels) : files_(std::move(files)), labels_(labels) {}
    void read(std::uint64_t count, void* dst) override {
        auto* out = static_cast<std::uint8_t*>(dst);
        while (count > 0) {
            if (file_ >= files_.size()) bad_input(files_.back()->path.string(), "fewer records than expected");
            const File& f = *files_[file_];
            const std::uint64_t in_file = f.bytes / cifar_record_bytes;
            const std::uint64_t take = std::min({count, in_file - record_, std::uint64_t{1024}});
            buf_.resize(take * cifar_record_bytes);
            read_all(f.fd, buf_.data(), buf_.size(), static_cast<long long>(record_ * cifar_record_bytes), f.path);
            for (std::uint64_t r = 0; r < take; ++r) {
                const std::uint8_t* rec = buf_.data() + r * cifar_record_bytes;
                if (labels_) {
                    const std::int32_t label = rec[0];
                    if (label > 9)
                        bad_input(f.path.string(), "record " + std::to_string(record_ + r) + " has label " +
                                                       std::to_string(label) + " (CIFAR-10 labels are 0..9)");
                    std::memcpy(out, &label, 4);
                    out += 4;
                } else {
                    std::memcpy(out, rec + 1, cifar_record_bytes - 1);
                    out += cifar_record_bytes - 1;
                }
            }
            record_ += take;
            count -= take;
            if (record_ == in_file) {
                ++file_;
                record_ = 0;
            }
        }
    }
    std::uint64_t sample_bytes() const override { return labels_ ? 4 : cifar_record_bytes - 1; }

  private:
    std::vector<std::shared_ptr<File>> files_;
    bool labels_;
    std::size_t file_ = 0;
    std::uint64_t record_ = 0;
    std::vector<std::uint8_t> buf_;
};

// ---- CIFAR-10 -----------------------------------------------------------

Source open_cifar(const fs::path& path) {
    Source s;
    s.format = InputFormat::cifar10;
    s.description = "CIFAR-10 binary batches";
    s.num_classes = 10;
    std::vector<fs::path> train, test;
    fs::path dir = path;
    if (fs::is_directory(path) && fs::exists(path / "cifar-10-batches-bin")) dir = path / "cifar-10-batches-bin";
    if (fs::is_directory(dir)) {
        for (const auto& e : fs::directory_iterator(dir)) {
            const std::string n = e.path().filename().string();
            if (n.rfind("data_batch_", 0) == 0 && ends_with(n, ".bin")) train.push_back(e.path());
            if (n == "test_batch.bin") test.push_back(e.path());
        }
        std::sort(train.begin(), train.end());
    } else {
        (path.filename().string() == "test_batch.bin" ? test : train).push_back(path);
    }
    for (auto* list : {&train, &test}) {
        if (list->empty()) continue;
        std::vector<std::shared_ptr<File>> files;
        SourceSplit split;
        split.name = list == &train ? "train" : "test";
        for (const fs::path& p : *list) {
            files.push_back(std::make_shared<File>(p));
            split.samples += cifar_record_count(files.back()->bytes, p.string());
        }
        SourceField x, y;
        x.name = "x";
        x.dtype = DType::u8;
        x.shape = Shape{{3, 32, 32}};
        x.stream = std::make_unique<CifarField>(files, false);
        y.name = "y";
        y.dtype = DType::i32;
        y.stream = std::make_unique<CifarField>(files, true);
        split.fields.push_back(std::move(x));
        split.fields.push_back(std::move(y));
        s.splits.push_back(std::move(split));
    }
    if (s.splits.empty()) bad_input(path.string(), "holds no data_batch_*.bin or test_batch.bin");
    return s;
}

} // namespace dstk::import

namespace dstk {

using namespace import;

std::uint64_t cifar_record_count(std::uint64_t file_bytes, const std::string& source) {
    if (file_bytes == 0 || file_bytes % cifar_record_bytes != 0)
        bad_input(source, std::to_string(file_bytes) + " bytes is not a whole number of CIFAR-10 records of " +
                              std::to_string(cifar_record_bytes) + " bytes (truncated, or not a CIFAR-10 batch?)");
    return file_bytes / cifar_record_bytes;
}

} // namespace dstk
