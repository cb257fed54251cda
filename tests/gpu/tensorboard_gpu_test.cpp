// dstrain --tensorboard on the GPU: the step points take the trainer's
// metrics mid-epoch (a synchronisation); training must not notice. With
// --deterministic the model is bit-equal with and without the event file,
// and the epoch's loss (now summed over the points' windows) agrees.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dstk/gpu_info.hpp"

namespace fs = std::filesystem;

namespace {

std::string bin(const char* tool) {
    return std::string(DSTK_BIN_DIR) + "/" + tool;
}

int run(const std::string& cmd) {
    const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

std::vector<double> epoch_losses(const fs::path& log) {
    std::vector<double> out;
    std::ifstream f(log);
    for (std::string line; std::getline(f, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j["event"] == "epoch") out.push_back(j["train_loss"].get<double>());
    }
    return out;
}

} // namespace

TEST(TensorBoardGpu, EventFileDoesNotChangeTraining) {
    if (!dstk::built_with_cuda()) GTEST_SKIP() << "built without CUDA support";
    if (auto why = dstk::no_gpu_reason()) GTEST_SKIP() << *why;
    const fs::path dir = fs::temp_directory_path() / ("dstk-tb-gpu-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    ASSERT_EQ(run(bin("dsgen") + " " + (dir / "data").string() + " --train 20K --test 2K --shape 3x32x32 -q"), 0);
    const std::string common = bin("dstrain") + " " + (dir / "data").string() +
                               " --model small-cnn --epochs 3 --deterministic --device cuda:0 -q";
    ASSERT_EQ(run(common + " --log-json " + (dir / "a.jsonl").string() + " --save " + (dir / "a.safetensors").string()),
              0);
    ASSERT_EQ(run(common + " --log-json " + (dir / "b.jsonl").string() + " --save " + (dir / "b.safetensors").string() +
                  " --tensorboard " + (dir / "tb").string()),
              0);
    EXPECT_EQ(slurp(dir / "a.safetensors"), slurp(dir / "b.safetensors")) << "the event file changed the weights";
    const auto a = epoch_losses(dir / "a.jsonl"), b = epoch_losses(dir / "b.jsonl");
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::max(1.0, a[i])) << "epoch " << i + 1;
    std::size_t files = 0;
    for (const auto& e : fs::directory_iterator(dir / "tb"))
        if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) ++files;
    EXPECT_EQ(files, 1u);
    fs::remove_all(dir);
}
