// JSON with a depth limit, UTF-8 checks, inputs that are not regular files,
// file descriptors 0-2, and manifest statistics that cannot normalise.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"
#include "dstk/manifest.hpp"
#include "support/error_of.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

using test_support::code_of;
using test_support::error_of;

std::string nested(int levels) {
    return std::string(static_cast<std::size_t>(levels), '[') + std::string(static_cast<std::size_t>(levels), ']');
}

TEST(Json, ReadsSixtyFourLevelsAndRefusesSixtyFive) {
    EXPECT_NO_THROW((void)parse_json(nested(json_max_depth)));
    EXPECT_THROW((void)parse_json(nested(json_max_depth + 1)), JsonDepthError);
    EXPECT_THROW((void)parse_json("{\"a\":" + nested(json_max_depth) + "}"), JsonDepthError);
    // Far deeper than any stack: refused at level 65, never recursed into.
    EXPECT_THROW((void)parse_json(nested(1'000'000)), JsonDepthError);
    EXPECT_THROW((void)parse_json("[1,"), nlohmann::json::parse_error);
}

TEST(Json, PrintsWithTheSameLimitAndNamesTextThatIsNotUtf8) {
    nlohmann::json j = 1;
    for (int i = 0; i < json_max_depth; ++i) j = nlohmann::json::array({j});
    EXPECT_EQ(dump_json(j, -1, "x"), nested(json_max_depth).insert(json_max_depth, "1"));
    j = nlohmann::json::array({j});
    EXPECT_NE(error_of([&] { (void)dump_json(j, -1, "the log"); }).find("cannot write the log (arrays or objects"),
              std::string::npos);
    const std::string e = error_of([] { (void)dump_json({{"name", "g\xe9"}}, 2, "the manifest"); });
    EXPECT_NE(e.find("cannot write the manifest (it would hold text that is not valid UTF-8"), std::string::npos) << e;
}

TEST(Json, Utf8IsCheckedStrictly) {
    EXPECT_TRUE(is_utf8("plain"));
    EXPECT_TRUE(is_utf8("g\xc3\xa9"));         // é
    EXPECT_TRUE(is_utf8("\xf0\x9f\x98\x80"));  // U+1F600
    EXPECT_FALSE(is_utf8("g\xe9"));            // Latin-1
    EXPECT_FALSE(is_utf8("\xc0\xaf"));         // overlong '/'
    EXPECT_FALSE(is_utf8("\xed\xa0\x80"));     // a surrogate
    EXPECT_FALSE(is_utf8("\xf4\x90\x80\x80")); // above U+10FFFF
    EXPECT_FALSE(is_utf8("\xe2\x82"));         // cut short
    EXPECT_EQ(escape_bytes("g\xe9\n\\"), "g\\xE9\\x0A\\x5C");
}

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("dstk-input-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

TEST(InputFile, AFifoOrADirectoryIsRefusedWithoutWaiting) {
    TempDir d;
    const fs::path fifo = d.path / "fifo", file = d.path / "file";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    std::ofstream(file) << "data";
    // No writer ever opens the FIFO: a blocking open would never return.
    const std::string e = error_of([&] { (void)open_input_file(fifo, "input"); });
    EXPECT_NE(e.find("cannot read input '" + fifo.string() + "' (it is a FIFO, not a regular file"), std::string::npos)
        << e;
    EXPECT_NE(error_of([&] { (void)open_input_file(d.path, "input"); }).find("it is a directory"), std::string::npos);
    EXPECT_EQ(code_of([&] { (void)open_input_file("/dev/null", "input"); }), ExitCode::failure);
    const UniqueFd fd = open_input_file(file, "input");
    EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_NONBLOCK, 0); // blocking reads again
    EXPECT_FALSE(try_open_input_file(d.path / "missing", "input"));
    EXPECT_EQ(errno, ENOENT);
    EXPECT_EQ(read_input_file(file, "input", 4), "data");
    EXPECT_NE(error_of([&] { (void)read_input_file(file, "input", 3); }).find("is larger than 3 B"), std::string::npos);
}

TEST(StandardFds, ClosedOnesAreOpenedOnDevNull) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(0);
        ::close(2);
        ensure_standard_fds();
        // The next file opened must not take 0 or 2.
        const int fd = ::open("/dev/null", O_RDONLY);
        struct stat st {};
        const bool ok = fd > 2 && ::fstat(2, &st) == 0 && S_ISCHR(st.st_mode) && ::fcntl(0, F_GETFD) != -1;
        ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

std::string manifest_with_stats(const std::string& stats) {
    return R"({"format_version":1,"splits":[{"name":"train","samples":2,"fields":[{"name":"x","dtype":"u8",)"
           R"("shape":[2],"storage":"npy","file":"train_x.npy","bytes":132}]}],"stats":)" +
           stats + "}";
}

TEST(ManifestStats, AStdThatCannotNormaliseIsRefusedNamingTheFix) {
    const std::string e = error_of([] { (void)parse_manifest(manifest_with_stats(R"({"mean":[1],"std":[0]})"), "m"); });
    EXPECT_NE(e.find("m: stats.std[0]: 0 cannot normalise"), std::string::npos) << e;
    EXPECT_NE(e.find("remove \"stats\""), std::string::npos) << e;
    EXPECT_EQ(code_of([] { (void)parse_manifest(manifest_with_stats(R"({"mean":[1],"std":[-2]})"), "m"); }),
              ExitCode::failure);
    EXPECT_EQ(code_of([] { (void)parse_manifest(manifest_with_stats(R"({"mean":[1],"std":[0.5]})"), "m"); }),
              ExitCode::ok);
}

TEST(ManifestStats, StatisticsThatCannotNormaliseAreNotWritten) {
    Manifest m = parse_manifest(manifest_with_stats(R"({"mean":[1],"std":[0.5]})"), "m");
    m.stats->std[0] = 0; // a constant channel
    EXPECT_FALSE(usable_stats(*m.stats));
    EXPECT_FALSE(parse_manifest(serialize_manifest(m), "again").stats);
}

} // namespace
} // namespace dstk
