// --direct where the filesystem refuses O_DIRECT: at the first read (the probe
// when the file is opened) the stream falls back with a notice; later, in the
// middle of an epoch, with one warning per file; either way the batches are
// those of buffered reads. The refusals are injected: this executable's pread
// fails with EINVAL on O_DIRECT descriptors once armed, since no filesystem
// here refuses reads it accepted at open.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "support/source_batch.hpp"
#include "dstk/dataset_writer.hpp"
#include "support/test_dataset.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;

namespace {

// O_DIRECT reads allowed before EINVAL; negative: never refuse.
std::atomic<long> direct_reads_left{-1};
std::atomic<long> direct_reads_refused{0};

using PreadFn = ssize_t (*)(int, void*, size_t, off_t);

ssize_t checked_pread(const char* name, int fd, void* buf, size_t n, off_t off) {
    static const auto real = reinterpret_cast<PreadFn>(::dlsym(RTLD_NEXT, name));
    if (direct_reads_left.load() >= 0 && (::fcntl(fd, F_GETFL) & O_DIRECT) && direct_reads_left.fetch_sub(1) <= 0) {
        direct_reads_refused.fetch_add(1);
        errno = EINVAL;
        return -1;
    }
    return real(fd, buf, n, off);
}

} // namespace

// The library's pread calls, in this executable only.
extern "C" ssize_t pread(int fd, void* buf, size_t n, off_t off) {
    return checked_pread("pread", fd, buf, n, off);
}
extern "C" ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
    return checked_pread("pread64", fd, buf, n, off);
}

namespace {

// Sample i: every byte is (i * 7 + j) & 0xff, its label i.
fs::path make_dataset(const std::string& name, std::uint64_t samples, std::uint64_t sample_bytes) {
    return test_support::write_u8_dataset(test_support::temp_path("dstk_direct", name), Shape{{sample_bytes}},
                                          {{"train", samples}}, static_cast<std::uint32_t>(samples),
                                          [](std::uint64_t i, std::span<std::uint8_t> b) {
                                              for (std::size_t j = 0; j < b.size(); ++j)
                                                  b[j] = static_cast<std::uint8_t>(i * 7 + j);
                                              return static_cast<std::int32_t>(i);
                                          });
}

std::vector<std::int32_t> run_epoch(BatchSource& s, std::uint64_t sample_bytes) {
    std::vector<std::int32_t> seen;
    s.start_epoch(0, 0);
    test_support::XY b;
    while (test_support::next_xy(s, b)) {
        const auto* x = static_cast<const std::uint8_t*>(b.x);
        for (std::uint32_t i = 0; i < b.size; ++i) {
            for (std::uint64_t j = 0; j < sample_bytes; ++j)
                EXPECT_EQ(x[i * sample_bytes + j], static_cast<std::uint8_t>(b.y[i] * 7 + j)) << "sample " << b.y[i];
            seen.push_back(b.y[i]);
        }
        s.release();
    }
    return seen;
}

struct Messages {
    std::mutex mutex;
    std::vector<std::string> notices, warnings;
};

// One epoch of a 4-reader stream source with --direct, O_DIRECT reads refused
// after `allowed` of them (the first is the probe at open).
std::vector<std::int32_t> direct_epoch(const Dataset& ds, std::uint64_t sample_bytes, long allowed, Messages& m) {
    SourceConfig c;
    c.placement = Placement::stream;
    c.device = {dstk::Backend::cpu, 0};
    c.order = {Order::chunk, 9, 50, 2};
    c.batch = 64;
    c.drop_last = false;
    c.prefetch = 4;
    c.readers = 4;
    c.direct = true;
    c.notice = [&m](const std::string& s) {
        std::lock_guard lock(m.mutex);
        m.notices.push_back(s);
    };
    c.warn = [&m](const std::string& s) {
        std::lock_guard lock(m.mutex);
        m.warnings.push_back(s);
    };
    direct_reads_refused = 0;
    direct_reads_left = allowed;
    auto s = make_batch_source(ds, "train", c);
    const auto labels = run_epoch(*s, sample_bytes);
    direct_reads_left = -1;
    return labels;
}

std::vector<std::int32_t> buffered_epoch(const Dataset& ds, std::uint64_t sample_bytes) {
    SourceConfig c;
    c.placement = Placement::stream;
    c.device = {dstk::Backend::cpu, 0};
    c.order = {Order::chunk, 9, 50, 2};
    c.batch = 64;
    c.drop_last = false;
    auto s = make_batch_source(ds, "train", c);
    return run_epoch(*s, sample_bytes);
}

bool o_direct_works(const fs::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) return false;
    ::close(fd);
    return true;
}

} // namespace

TEST(DataDirectFallback, ReadRefusedMidEpochFallsBackWithOneWarning) {
    const std::uint64_t n = 3000, sb = 48; // 48-byte samples: reads straddle 4 KiB blocks
    const fs::path dir = make_dataset("mid", n, sb);
    const Dataset ds = Dataset::open(dir);
    if (!o_direct_works(dir / ds.manifest().split("train").field("x").file))
        GTEST_SKIP() << "the filesystem of " << dir << " refuses O_DIRECT at open (covered by data_source_test)";
    const auto expected = buffered_epoch(ds, sb);
    ASSERT_EQ(expected.size(), n);
    Messages m;
    EXPECT_EQ(direct_epoch(ds, sb, 4, m), expected); // the probe and three reads, then EINVAL
    // Readers already inside an O_DIRECT read may each see one refusal; none after.
    EXPECT_GE(direct_reads_refused.load(), 1);
    EXPECT_LE(direct_reads_refused.load(), 4);
    EXPECT_TRUE(m.notices.empty()) << m.notices.front();
    ASSERT_EQ(m.warnings.size(), 1u) << "one warning per file, whatever the reader count";
    EXPECT_NE(m.warnings[0].find("train_x"), std::string::npos) << m.warnings[0];
    EXPECT_NE(m.warnings[0].find("O_DIRECT"), std::string::npos) << m.warnings[0];
    EXPECT_NE(m.warnings[0].find("page cache"), std::string::npos) << m.warnings[0];
    fs::remove_all(dir);
}

TEST(DataDirectFallback, ReadRefusedAtOpenFallsBackWithANotice) {
    const std::uint64_t n = 700, sb = 40;
    const fs::path dir = make_dataset("open", n, sb);
    const Dataset ds = Dataset::open(dir);
    if (!o_direct_works(dir / ds.manifest().split("train").field("x").file))
        GTEST_SKIP() << "the filesystem of " << dir << " refuses O_DIRECT at open (covered by data_source_test)";
    Messages m;
    EXPECT_EQ(direct_epoch(ds, sb, 0, m), buffered_epoch(ds, sb)); // the probe is refused
    EXPECT_EQ(direct_reads_refused.load(), 1);
    EXPECT_TRUE(m.warnings.empty()) << m.warnings.front();
    ASSERT_EQ(m.notices.size(), 1u);
    EXPECT_NE(m.notices[0].find("train_x"), std::string::npos) << m.notices[0];
    EXPECT_NE(m.notices[0].find("page cache"), std::string::npos) << m.notices[0];
    fs::remove_all(dir);
}
