// TensorBoard event files: CRC-32C against published vectors, the TFRecord
// framing, the Event/Summary encoding byte for byte, and the file's naming.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <unistd.h>

#include <gtest/gtest.h>

#include "dstk/checksum.hpp"
#include "dstk/run/tensorboard.hpp"
#include "support/error_of.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::run;
using test_support::code_of;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        char tmpl[] = "/tmp/dstk-tb-test-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { fs::remove_all(path); }
};

std::uint32_t crc_of(const std::string& s) {
    return crc32c(s.data(), s.size());
}

template <class T> T load(const std::string& s, std::size_t at) {
    T v;
    std::memcpy(&v, s.data() + at, sizeof v);
    return v;
}

std::string file_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

// The records of a TFRecord file, each checked against its CRCs.
std::vector<std::string> records(const std::string& bytes) {
    std::vector<std::string> out;
    std::size_t at = 0;
    while (at < bytes.size()) {
        EXPECT_GE(bytes.size() - at, 16u);
        const auto len = load<std::uint64_t>(bytes, at);
        EXPECT_EQ(load<std::uint32_t>(bytes, at + 8), masked_crc32c(bytes.data() + at, 8));
        const std::string data = bytes.substr(at + 12, len);
        EXPECT_EQ(load<std::uint32_t>(bytes, at + 12 + len), masked_crc32c(data.data(), data.size()));
        out.push_back(data);
        at += 16 + len;
    }
    return out;
}

} // namespace

// RFC 3720 (iSCSI) B.4 and the usual check value of "123456789".
TEST(TensorBoard, Crc32cKnownVectors) {
    EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
    EXPECT_EQ(crc_of(std::string(32, '\0')), 0x8A9136AAu);
    EXPECT_EQ(crc_of(std::string(32, '\xff')), 0x62A8AB43u);
    std::string up(32, '\0'), down(32, '\0');
    std::iota(up.begin(), up.end(), 0);
    for (int i = 0; i < 32; ++i) down[i] = static_cast<char>(31 - i);
    EXPECT_EQ(crc_of(up), 0x46DD794Eu);
    EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
    EXPECT_EQ(crc_of(""), 0u);
    // Streaming: the CRC of a prefix continues over the rest.
    EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);
}

TEST(TensorBoard, MaskedCrcRotatesAndAddsTheConstant) {
    const std::uint32_t c = 0xE3069283u;
    EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, RecordFraming) {
    const std::string r = tfrecord("abc");
    ASSERT_EQ(r.size(), 3u + 16u);
    EXPECT_EQ(load<std::uint64_t>(r, 0), 3u);
    EXPECT_EQ(load<std::uint32_t>(r, 8), masked_crc32c(r.data(), 8));
    EXPECT_EQ(r.substr(12, 3), "abc");
    EXPECT_EQ(load<std::uint32_t>(r, 15), masked_crc32c("abc", 3));
    EXPECT_EQ(tfrecord("").size(), 16u);
}

TEST(TensorBoard, EventEncodingByteForByte) {
    // Event{wall_time=1.5 (field 1, fixed64), step=300 (field 2, varint ac 02),
    //       summary (field 5) {value (field 1) {tag "a/b" (field 1), simple_value 2.0f (field 2, fixed32)}}}
    const std::string e = scalars_event(1.5, 300, {{"a/b", 2.0}});
    std::string want = "\x09";
    const double wall = 1.5;
    want.append(reinterpret_cast<const char*>(&wall), 8);
    want += "\x10\xac\x02";
    const float two = 2.0f;
    std::string value = std::string("\x0a\x03"
                                    "a/b\x15",
                                    6);
    value.append(reinterpret_cast<const char*>(&two), 4);
    const std::string summary = "\x0a" + std::string(1, static_cast<char>(value.size())) + value;
    want += "\x2a" + std::string(1, static_cast<char>(summary.size())) + summary;
    EXPECT_EQ(e, want);

    const std::string v = file_version_event(2.0);
    EXPECT_EQ(v.substr(9), std::string("\x1a\x0d"
                                       "brain.Event:2",
                                       15)); // step 0 left out (proto3)
}

TEST(TensorBoard, EventFileNamingAndRecords) {
    TempDir t;
    const fs::path dir = t.path / "tb" / "run1"; // parents created
    EventFile a(dir);
    EventFile b(dir); // same second, same pid: the next free name
    EXPECT_NE(a.path(), b.path());
    EXPECT_EQ(a.path().parent_path(), dir);
    EXPECT_EQ(a.path().filename().string().rfind("events.out.tfevents.", 0), 0u);
    a.write(10, {{"loss/train", 0.25}, {"accuracy/train", 0.5}});
    a.write(20, {{"loss/train", 0.125}});
    const auto recs = records(file_bytes(a.path()));
    ASSERT_EQ(recs.size(), 3u);
    EXPECT_NE(recs[0].find("brain.Event:2"), std::string::npos);
    EXPECT_NE(recs[1].find("accuracy/train"), std::string::npos);
    EXPECT_EQ(recs[2].substr(9, 2), "\x10\x14"); // step 20
    EXPECT_EQ(records(file_bytes(b.path())).size(), 1u);
}

TEST(TensorBoard, ADirectoryThatCannotBeMadeIsAUsageError) {
    TempDir t;
    std::ofstream(t.path / "file") << "x";
    EXPECT_EQ(code_of([&] { EventFile f(t.path / "file"); }), ExitCode::usage);
}
