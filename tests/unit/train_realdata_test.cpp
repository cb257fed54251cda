// Real data: MNIST's 10,000 test images (../shared/data/mnist), split 8,000
// train / 2,000 test, small-cnn on the CPU at batch 64 (the command README and
// man dstrain give): >= 98% test accuracy within 5 epochs and 3 minutes on 2
// cores. Skipped where the shared folder is absent.
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>

#include "dstk/dataset_writer.hpp"
#include "dstk/run/train_run.hpp"

using namespace dstk;
namespace fs = std::filesystem;

namespace {

std::vector<std::uint8_t> gunzip(const fs::path& p) {
    gzFile f = gzopen(p.c_str(), "rb");
    if (!f) return {};
    std::vector<std::uint8_t> out;
    std::uint8_t buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
    gzclose(f);
    return out;
}

std::uint32_t be32(const std::uint8_t* p) {
    return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

// Writes the IDX images and labels as a dataset with train = the first 8,000, test = the rest.
void write_mnist_dataset(const fs::path& images, const fs::path& labels, const fs::path& out) {
    const auto img = gunzip(images), lab = gunzip(labels);
    ASSERT_GE(img.size(), 16u);
    ASSERT_GE(lab.size(), 8u);
    ASSERT_EQ(be32(img.data()), 0x803u);
    ASSERT_EQ(be32(lab.data()), 0x801u);
    const std::uint32_t n = be32(img.data() + 4), rows = be32(img.data() + 8), cols = be32(img.data() + 12);
    ASSERT_EQ(n, 10000u);
    ASSERT_EQ(img.size(), 16u + std::size_t{n} * rows * cols);
    ASSERT_EQ(be32(lab.data() + 4), n);
    DatasetWriter w(out, true);
    Manifest m;
    m.num_classes = 10;
    const Shape shape{{1, rows, cols}};
    for (const auto& [name, first, count] : {std::tuple{"train", 0u, 8000u}, std::tuple{"test", 8000u, 2000u}}) {
        SplitInfo s;
        s.name = name;
        s.samples = count;
        auto x = w.npy_field(name, "x", DType::u8, shape, count);
        x->append(img.data() + 16 + std::size_t{first} * rows * cols, count);
        // dstrain's data path reads one i32 label per sample (dsconvert writes them so).
        std::vector<std::int32_t> labels32(lab.begin() + 8 + first, lab.begin() + 8 + first + count);
        auto y = w.npy_field(name, "y", DType::i32, Shape{}, count);
        y->append(labels32.data(), count);
        s.fields = {x->finish(), y->finish()};
        m.splits.push_back(s);
    }
    w.commit(m);
}

} // namespace

TEST(TrainRealData, SmallCnnOnMnistCpu) {
    const fs::path mnist = fs::path(DSTK_SHARED_DIR) / "data" / "mnist";
    const fs::path images = mnist / "t10k-images-idx3-ubyte.gz", labels = mnist / "t10k-labels-idx1-ubyte.gz";
    if (!fs::exists(images) || !fs::exists(labels))
        GTEST_SKIP() << "no MNIST at " << mnist << " (shared folder absent)";
    const fs::path dir = fs::temp_directory_path() / ("dstk_mnist_" + std::to_string(::getpid()));
    write_mnist_dataset(images, labels, dir);
    if (HasFatalFailure()) return;

    run::TrainOptions o;
    o.dataset = dir;
    o.model = "small-cnn";
    o.epochs = 5;
    o.batch = 64;
    o.device = dstk::Device{dstk::Backend::cpu, 0};
    o.threads = 2;
    o.files.save = {dir / "model.safetensors"}; // every run saves its model: into the dataset, removed below
    OutputOptions out;
    out.quiet = true;
    const auto t0 = std::chrono::steady_clock::now();
    const run::RunReport r = run::run_training(o, run::DataOptions{}, out);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fs::remove_all(dir);
    ASSERT_EQ(r.epochs.size(), 5u);
    EXPECT_GE(r.epochs.back().test.accuracy(), 0.98);
    EXPECT_LE(seconds, 180.0);
    std::printf("small-cnn on MNIST (8,000 / 2,000), cpu: test accuracy %.2f%% in %.1f s\n",
                100.0 * r.epochs.back().test.accuracy(), seconds);
}
