// The kernel-choice cache: key, round trip, corrupt and foreign files,
// concurrent writers, and the timing decision rule.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dstk/error.hpp"
#include "dstk/train/choice_cache.hpp"

namespace fs = std::filesystem;
using namespace dstk::train;

namespace {

DeviceIdentity identity(std::string gpu = "NVIDIA H100 80GB HBM3", std::string cudnn = "9.1.0") {
    return {gpu, "9.0", "12.4", cudnn, "0.1.0", "1"};
}

struct TempDir {
    fs::path path;
    TempDir() {
        char tmpl[] = "/tmp/dstk-choice-XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempDir() { fs::remove_all(path); }
};

std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write(const fs::path& p, const std::string& text) {
    std::ofstream(p) << text;
}

Choice choice(std::string kernel, double ms) {
    return {std::move(kernel), ms, ms * 1.2, 5, 7};
}

ConvKey key() {
    ConvKey k;
    k.op = "bwd_filter";
    k.precision = Precision::bf16;
    k.n = 256;
    k.c = 32;
    k.h = 32;
    k.w = 32;
    k.k = 64;
    k.kernel = 3;
    k.stride = 1;
    k.pad = 1;
    k.workspace = 256u << 20;
    return k;
}

} // namespace

TEST(ChoiceCache, KeyNamesEveryFieldInOneWord) {
    const ConvKey base = key();
    const std::string t = base.text();
    EXPECT_EQ(t.find(' '), std::string::npos);
    std::set<std::string> seen{t};
    auto differs = [&](auto change) {
        ConvKey k = base;
        change(k);
        EXPECT_TRUE(seen.insert(k.text()).second) << k.text();
    };
    differs([](ConvKey& k) { k.op = "fwd"; });
    differs([](ConvKey& k) { k.precision = Precision::tf32; });
    differs([](ConvKey& k) { k.deterministic = true; });
    differs([](ConvKey& k) { k.nchw = true; });
    differs([](ConvKey& k) { k.n = 128; });
    differs([](ConvKey& k) { k.c = 64; });
    differs([](ConvKey& k) { k.h = 16; });
    differs([](ConvKey& k) { k.w = 16; });
    differs([](ConvKey& k) { k.k = 32; });
    differs([](ConvKey& k) { k.kernel = 1; });
    differs([](ConvKey& k) { k.stride = 2; });
    differs([](ConvKey& k) { k.pad = 0; });
    differs([](ConvKey& k) { k.workspace = 1; });
    // The file name follows the identity: GPU, driver, cuDNN, dstk, kernel set.
    EXPECT_NE(choice_file_name(identity()), choice_file_name(identity("NVIDIA H200")));
    EXPECT_NE(choice_file_name(identity()), choice_file_name(identity("NVIDIA H100 80GB HBM3", "9.2.0")));
    EXPECT_EQ(choice_file_name(identity()), choice_file_name(identity()));
}

TEST(ChoiceCache, ModesParseAndName) {
    for (const auto m : {KernelMode::automatic, KernelMode::cached, KernelMode::retune, KernelMode::heuristic})
        EXPECT_EQ(parse_kernel_mode(kernel_mode_name(m)), m);
    EXPECT_THROW(parse_kernel_mode("fast"), dstk::Error);
}

TEST(ChoiceCache, DefaultDirFollowsXdg) {
    const char* old = std::getenv("XDG_CACHE_HOME");
    const std::string saved = old ? old : "";
    ::setenv("XDG_CACHE_HOME", "/tmp/xdg-here", 1);
    EXPECT_EQ(default_choice_dir(), fs::path("/tmp/xdg-here/dstk"));
    ::setenv("XDG_CACHE_HOME", "relative", 1); // not absolute: ignored, as the XDG spec says
    EXPECT_EQ(default_choice_dir(), fs::path(std::getenv("HOME")) / ".cache" / "dstk");
    if (old)
        ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
    else
        ::unsetenv("XDG_CACHE_HOME");
}

TEST(ChoiceCache, RoundTrip) {
    TempDir d;
    std::vector<std::string> notices;
    {
        ChoiceCache c(d.path / "sub", identity(), [&](const std::string& n) { notices.push_back(n); });
        EXPECT_FALSE(c.find(key().text()));
        c.put(key().text(), choice("own:tc_wgrad", 0.0381));
        c.put("conv.fwd.x", choice("cudnn:1:tensor", 0.25));
        EXPECT_TRUE(c.store());
    }
    ChoiceCache again(d.path / "sub", identity(), [&](const std::string& n) { notices.push_back(n); });
    EXPECT_TRUE(notices.empty());
    ASSERT_EQ(again.size(), 2u);
    EXPECT_EQ(*again.find(key().text()), choice("own:tc_wgrad", 0.0381));
    EXPECT_EQ(again.find("conv.fwd.x")->kernel, "cudnn:1:tensor");
    // Nothing but the file (and its lock) is left in the directory.
    for (const auto& e : fs::directory_iterator(d.path / "sub"))
        EXPECT_TRUE(e.path() == again.path() || e.path().extension() == ".lock") << e.path();

    std::map<std::string, Choice> parsed;
    const std::string text = serialise_choices(identity(), {{"k", choice("a", 1.5)}});
    ASSERT_TRUE(parse_choices(text, identity(), parsed, nullptr));
    EXPECT_EQ(parsed.at("k"), choice("a", 1.5));
}

TEST(ChoiceCache, CorruptFileIsIgnoredWithANoticeAndRewritten) {
    TempDir d;
    const fs::path file = d.path / choice_file_name(identity());
    const std::string good = serialise_choices(identity(), {{"k1", choice("a", 1.0)}, {"k2", choice("b", 2.0)}});
    const std::vector<std::string> bad = {
        "\x01\x02garbage",
        good.substr(0, good.size() - 8),                         // truncated: no end line
        good.substr(0, good.size() - 1),                         // last line incomplete
        std::string(good).replace(good.find(" 5/7"), 4, " 9/7"), // more wins than repetitions
        std::string(good).replace(good.find("end 2"), 5, "end 3"),
        good + "k3 c 1 1 1/1\n", // after the end line
    };
    for (const auto& text : bad) {
        write(file, text);
        std::vector<std::string> notices;
        ChoiceCache c(d.path, identity(), [&](const std::string& n) { notices.push_back(n); });
        EXPECT_EQ(c.size(), 0u);
        ASSERT_EQ(notices.size(), 1u);
        EXPECT_NE(notices[0].find("ignored"), std::string::npos) << notices[0];
        c.put("k9", choice("z", 3.0));
        EXPECT_TRUE(c.store());
        std::map<std::string, Choice> parsed;
        EXPECT_TRUE(parse_choices(read(file), identity(), parsed, nullptr));
        EXPECT_EQ(parsed.size(), 1u);
    }
    // A directory where the file should be: a notice, and store() fails softly.
    fs::remove(file);
    fs::create_directory(file);
    std::vector<std::string> notices;
    ChoiceCache c(d.path, identity(), [&](const std::string& n) { notices.push_back(n); });
    c.put("k", choice("a", 1.0));
    EXPECT_FALSE(c.store());
    EXPECT_EQ(notices.size(), 2u);
    EXPECT_TRUE(fs::is_directory(file));
}

TEST(ChoiceCache, AnotherGpuOrCudnnDoesNotSeeTheChoices) {
    TempDir d;
    {
        ChoiceCache c(d.path, identity(), nullptr);
        c.put("k", choice("cudnn:1:tensor", 1.0));
        ASSERT_TRUE(c.store());
    }
    for (const auto& other : {identity("NVIDIA H200"), identity("NVIDIA H100 80GB HBM3", "9.2.0")}) {
        std::vector<std::string> notices;
        ChoiceCache c(d.path, other, [&](const std::string& n) { notices.push_back(n); });
        EXPECT_FALSE(c.find("k"));
        EXPECT_TRUE(notices.empty()); // its own file does not exist yet
        // The first identity's file copied under the other's name: foreign, ignored.
        fs::copy_file(d.path / choice_file_name(identity()), c.path(), fs::copy_options::overwrite_existing);
        ChoiceCache copied(d.path, other, [&](const std::string& n) { notices.push_back(n); });
        EXPECT_FALSE(copied.find("k"));
        ASSERT_EQ(notices.size(), 1u);
        EXPECT_NE(notices[0].find("another device"), std::string::npos) << notices[0];
    }
    ChoiceCache same(d.path, identity(), nullptr);
    EXPECT_TRUE(same.find("k"));
}

TEST(ChoiceCache, ConcurrentWritersKeepEachOthersEntries) {
    TempDir d;
    constexpr int writers = 6, rounds = 10;
    std::vector<pid_t> pids;
    for (int w = 0; w < writers; ++w) {
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            bool ok = true;
            for (int r = 0; r < rounds; ++r) {
                ChoiceCache c(d.path, identity(), nullptr);
                c.put("w" + std::to_string(w) + ".r" + std::to_string(r), choice("k" + std::to_string(w), 1.0 + r));
                ok = c.store() && ok;
            }
            ::_exit(ok ? 0 : 1);
        }
        pids.push_back(pid);
    }
    for (const pid_t pid : pids) {
        int status = 0;
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    std::vector<std::string> notices;
    ChoiceCache c(d.path, identity(), [&](const std::string& n) { notices.push_back(n); });
    EXPECT_TRUE(notices.empty());
    EXPECT_EQ(c.size(), static_cast<std::size_t>(writers * rounds));
}

TEST(ChoiceCache, PickTakesTheMedianAndBreaksNearTies) {
    // a: one slow outlier, median 1.0; b: median 1.1.
    std::vector<CandidateTimes> c = {{"a", {1.0, 9.0, 1.0, 1.0, 1.0}}, {"b", {1.1, 1.1, 1.1, 1.1, 1.1}}};
    auto p = pick_fastest(c);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->choice.kernel, "a");
    EXPECT_DOUBLE_EQ(p->choice.median_ms, 1.0);
    EXPECT_DOUBLE_EQ(p->choice.runner_up_ms, 1.1);
    EXPECT_EQ(p->choice.wins, 4u);
    EXPECT_EQ(p->choice.repetitions, 5u);
    EXPECT_FALSE(p->near_tie);
    // Within 3%: the previous choice stays.
    c = {{"a", {1.00, 1.00, 1.00}}, {"b", {1.02, 1.02, 1.02}}};
    EXPECT_EQ(pick_fastest(c, "b")->choice.kernel, "b");
    EXPECT_TRUE(pick_fastest(c, "b")->near_tie);
    EXPECT_EQ(pick_fastest(c, "other")->choice.kernel, "a");
    // Within 3%, no previous: the one fastest in more repetitions, even with the higher median.
    c = {{"a", {0.97, 0.97, 0.97, 1.10, 1.10}}, {"b", {0.96, 0.98, 0.98, 0.98, 0.98}}};
    EXPECT_EQ(pick_fastest(c)->choice.kernel, "b");
    EXPECT_EQ(pick_fastest(c)->choice.wins, 3u);
    // Beyond the margin the median decides, whatever the wins.
    c = {{"a", {1.0, 1.0, 1.0}}, {"b", {0.5, 2.0, 2.0}}};
    EXPECT_EQ(pick_fastest(c, "b")->choice.kernel, "a");
    // Candidates without times are skipped; none at all: no pick.
    c = {{"a", {}}, {"b", {2.0}}};
    EXPECT_EQ(pick_fastest(c)->index, 1u);
    EXPECT_FALSE(pick_fastest({{"a", {}}}));
}

TEST(ChoiceCache, RunLinesNameEachLayersChoicesAndSources) {
    const NetworkPlan plan =
        plan_network(resolve_model("conv3x3:32,bn,relu,conv3x3:32,flatten,fc:10", 10), TensorShape{3, 8, 8}, 10);
    const std::vector<KernelReport> r = {
        {0, "fwd", "own:direct_conv", ChoiceSource::rule, 0.0},
        {3, "fwd", "cudnn:1:tensor", ChoiceSource::cache, 0.052},
        {3, "bwd_data", "cudnn:1:tensor", ChoiceSource::heuristic, 0.0},
        {3, "bwd_filter", "own:tc_wgrad", ChoiceSource::timed, 0.038},
        {plan.layers.size(), "weight_gradients", "side_stream", ChoiceSource::timed, 0.61}};
    const auto lines = kernel_choice_lines(r, plan);
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[2], "step: weight_gradients side_stream (timed 0.6100 ms)");
    EXPECT_EQ(lines[0], "L0 conv 3->32 at 8x8: fwd own:direct_conv (rule)");
    EXPECT_EQ(lines[1], "L3 conv 32->32 at 8x8: fwd cudnn:1:tensor (cache 0.0520 ms), bwd_data cudnn:1:tensor "
                        "(heuristic), bwd_filter own:tc_wgrad (timed 0.0380 ms)");
}
