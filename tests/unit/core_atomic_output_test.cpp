// The output helper's rules, decided at the rename: each case once with
// renameat2's flags and once through the fallbacks of filesystems without
// them (DSTK_TEST_NO_RENAMEAT2), with the name taken between the start of the
// output and its commit, as another process would take it.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"
#include "support/error_of.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

using test_support::code_of;
using test_support::error_of;

struct TempDir {
    fs::path path;
    TempDir() {
        // A parameterised test's name ends in "/N": one directory, not a folder inside another.
        std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
        std::replace(name.begin(), name.end(), '/', '-');
        path = fs::temp_directory_path() / ("dstk-atomic-" + std::to_string(::getpid()) + "-" + name);
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

void put(const fs::path& p, const std::string& text) {
    std::ofstream(p) << text;
}
std::string get(const fs::path& p) {
    std::ifstream in(p);
    return {std::istreambuf_iterator<char>(in), {}};
}
// Nothing of ours left in `dir`: no ".NAME.tmp-PID-N".
bool no_temporaries(const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().find(".tmp-") != std::string::npos) return false;
    return true;
}
void file_output(const fs::path& p, Replace r, const std::string& text, const std::function<void()>& meanwhile) {
    AtomicFile f(p, r);
    f.write(text.data(), text.size());
    meanwhile();
    f.commit();
}

// Every test runs with and without renameat2's flags.
class Rename : public ::testing::TestWithParam<bool> {
  protected:
    void SetUp() override {
        if (GetParam()) ::setenv("DSTK_TEST_NO_RENAMEAT2", "1", 1);
    }
    void TearDown() override { ::unsetenv("DSTK_TEST_NO_RENAMEAT2"); }
};
INSTANTIATE_TEST_SUITE_P(WithAndWithoutRenameat2, Rename, ::testing::Values(false, true));

TEST_P(Rename, ANameTakenMeanwhileIsNeverReplacedWithoutForce) {
    TempDir d;
    const fs::path out = d.path / "out.npy";
    const std::string e = error_of([&] { file_output(out, Replace::never, "ours", [&] { put(out, "theirs"); }); });
    EXPECT_NE(e.find("already exists (another process wrote it while this one ran; nothing was replaced)"),
              std::string::npos)
        << e;
    EXPECT_EQ(get(out), "theirs");
    EXPECT_TRUE(no_temporaries(d.path));
    file_output(d.path / "free.npy", Replace::never, "ours", [] {});
    EXPECT_EQ(get(d.path / "free.npy"), "ours");
}

TEST_P(Rename, ForceReplacesARegularFileButNeverALinkOrADirectory) {
    TempDir d;
    const fs::path out = d.path / "out.npy", target = d.path / "target";
    put(out, "old");
    file_output(out, Replace::earlier, "new", [] {});
    EXPECT_EQ(get(out), "new");
    put(target, "keep");
    const std::string e = error_of([&] {
        file_output(out, Replace::earlier, "newer", [&] {
            fs::remove(out);
            fs::create_symlink(target, out);
        });
    });
    EXPECT_NE(e.find("exists and is a symbolic link"), std::string::npos) << e;
    EXPECT_TRUE(fs::is_symlink(out));
    EXPECT_EQ(get(target), "keep");
    fs::remove(out);
    EXPECT_EQ(code_of([&] { file_output(out, Replace::earlier, "x", [&] { fs::create_directory(out); }); }),
              ExitCode::usage);
    EXPECT_TRUE(fs::is_directory(out));
    EXPECT_TRUE(no_temporaries(d.path));
}

TEST_P(Rename, NextFreeTakesTheFirstFreeNumberedName) {
    TempDir d;
    const fs::path out = d.path / "model.safetensors";
    put(out, "a");
    put(d.path / "model-2.safetensors", "b");
    AtomicFile f(out, Replace::next_free);
    f.write("c", 1);
    f.commit();
    EXPECT_EQ(f.final_path(), d.path / "model-3.safetensors");
    EXPECT_EQ(get(out), "a");
    EXPECT_EQ(get(d.path / "model-3.safetensors"), "c");
}

TEST_P(Rename, ForceReplacesOnlyADirectoryADstkToolWrote) {
    TempDir d;
    const fs::path out = d.path / "ds";
    {
        AtomicDir dir(out, Replace::never);
        put(dir.file("dataset.json"), R"({"splits":[{"name":"train","fields":[{"file":"train_x.npy"}]}]})");
        put(dir.file("train_x.npy"), "1");
        dir.commit();
    }
    {
        AtomicDir dir(out, Replace::earlier);
        put(dir.file("dataset.json"), R"({"splits":[{"name":"train","fields":[{"file":"train_x.npy"}]}]})");
        put(dir.file("train_x.npy"), "2");
        put(out / "notes.txt", "mine"); // added to the earlier dataset while this one ran
        const std::string e = error_of([&] { dir.commit(); });
        EXPECT_NE(e.find("is a dataset that also holds 'notes.txt'"), std::string::npos) << e;
    }
    EXPECT_EQ(get(out / "notes.txt"), "mine");
    EXPECT_EQ(get(out / "train_x.npy"), "1");
    fs::remove(out / "notes.txt");
    {
        AtomicDir dir(out, Replace::earlier);
        put(dir.file("dataset.json"), R"({"splits":[{"name":"train","fields":[{"file":"train_x.npy"}]}]})");
        put(dir.file("train_x.npy"), "3");
        dir.commit();
    }
    EXPECT_EQ(get(out / "train_x.npy"), "3");
    EXPECT_TRUE(no_temporaries(d.path));
}

TEST_P(Rename, AFolderMadeMeanwhileIsNotReplacedByForce) {
    TempDir d;
    const fs::path out = d.path / "ds";
    AtomicDir dir(out, Replace::earlier);
    put(dir.file("dataset.json"), "{}");
    fs::create_directory(out);
    put(out / "notes.txt", "mine");
    const std::string e = error_of([&] { dir.commit(); });
    EXPECT_NE(e.find("is a directory but not a dataset"), std::string::npos) << e;
    EXPECT_EQ(get(out / "notes.txt"), "mine");
}

TEST_P(Rename, SideFilesAreWithdrawnWhenTheMainOutputCannotBePlaced) {
    TempDir d;
    const fs::path report = d.path / "report.json", out = d.path / "out.npy";
    put(report, "earlier report");
    AtomicFile side(report, Replace::earlier);
    side.write("new report", 10);
    AtomicFile main(out, Replace::never);
    main.write("data", 4);
    put(out, "theirs"); // taken meanwhile
    OutputSet set;
    set.add(side);
    set.add(main);
    EXPECT_EQ(code_of([&] { set.commit(); }), ExitCode::usage);
    EXPECT_EQ(get(report), "earlier report");
    EXPECT_EQ(get(out), "theirs");
    EXPECT_FALSE(side.committed());
}

TEST_P(Rename, AnOutputSetPutsEverythingInPlace) {
    TempDir d;
    AtomicFile a(d.path / "a.json", Replace::never), b(d.path / "b.npy", Replace::never);
    a.write("a", 1);
    b.write("b", 1);
    OutputSet set;
    set.add(a);
    set.add(b);
    set.commit();
    EXPECT_EQ(get(d.path / "a.json"), "a");
    EXPECT_EQ(get(d.path / "b.npy"), "b");
    EXPECT_TRUE(no_temporaries(d.path));
}

TEST(CheckOverwrite, NamesWhatItRefusesAndWhy) {
    TempDir d;
    const fs::path f = d.path / "f", dir = d.path / "dir", link = d.path / "link";
    put(f, "x");
    fs::create_directory(dir);
    put(dir / "keep", "x");
    fs::create_symlink(f, link);
    EXPECT_NE(error_of([&] { check_overwrite(f, false); }).find("already exists"), std::string::npos);
    EXPECT_EQ(code_of([&] { check_overwrite(f, true); }), ExitCode::ok);
    EXPECT_NE(error_of([&] { check_overwrite(link, true); }).find("never replaced, --force or not"), std::string::npos);
    EXPECT_NE(error_of([&] { check_overwrite(dir, true, true); }).find("is a directory but not a dataset"),
              std::string::npos);
    EXPECT_NE(error_of([&] { check_overwrite(dir, true, false); }).find("a file output never replaces one"),
              std::string::npos);
    fs::remove(dir / "keep");
    EXPECT_EQ(code_of([&] { check_overwrite(dir, true, true); }), ExitCode::ok); // empty: nothing lost
}

} // namespace
} // namespace dstk
