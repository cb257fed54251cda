#include "dstk/chunked_file.hpp"

#include <cstdio>
#include <fstream>
#include <gtest/gtest.h>
#include <numeric>
#include <unistd.h>

#include "dstk/error.hpp"
#include "dstk/thread_pool.hpp"

namespace fs = std::filesystem;
using namespace dstk;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("dstk-chunked-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

std::vector<std::uint8_t> pattern(std::uint64_t bytes) {
    std::vector<std::uint8_t> v(bytes);
    std::uint64_t x = 12345;
    for (auto& b : v) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        b = static_cast<std::uint8_t>((x >> 60) + (&b - v.data()) % 7); // compressible but not trivial
    }
    return v;
}

std::string write_file(const fs::path& p, const std::vector<std::uint8_t>& data, std::uint64_t sample_bytes,
                       std::uint64_t chunk_samples, unsigned threads, std::uint64_t piece = 17) {
    ThreadPool pool(threads);
    ChunkedWriter w(p, sample_bytes, chunk_samples, 3, pool);
    const std::uint64_t n = data.size() / sample_bytes;
    for (std::uint64_t i = 0; i < n; i += piece) w.append(data.data() + i * sample_bytes, std::min(piece, n - i));
    return w.finish();
}

std::vector<std::uint8_t> slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

void flip_byte(const fs::path& p, std::uint64_t offset) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5A);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
}

} // namespace

TEST(ChunkedFile, RoundTripAndRandomAccess) {
    TempDir t;
    const std::uint64_t sb = 12, n = 1000, cs = 64;
    const auto data = pattern(sb * n);
    write_file(t.path / "a.zc", data, sb, cs, 2);
    ChunkedReader r(t.path / "a.zc");
    EXPECT_EQ(r.samples(), n);
    EXPECT_EQ(r.chunks(), (n + cs - 1) / cs);
    EXPECT_EQ(r.chunk_range(r.chunks() - 1).count, n % cs);
    std::vector<std::uint8_t> all(sb * n);
    ThreadPool pool(3);
    r.read(0, n, all.data(), &pool);
    EXPECT_EQ(all, data);
    for (auto [first, count] : {std::pair<std::uint64_t, std::uint64_t>{5, 1}, {63, 2}, {100, 500}, {999, 1}, {0, 0}}) {
        std::vector<std::uint8_t> part(sb * count);
        r.read(first, count, part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + first * sb)) << first << "+" << count;
    }
    std::vector<std::uint8_t> chunk(r.chunk_bytes(3));
    r.read_chunk(3, chunk.data());
    EXPECT_TRUE(std::equal(chunk.begin(), chunk.end(), data.begin() + 3 * cs * sb));
    EXPECT_THROW(r.read(990, 11, all.data()), Error);
    r.verify(&pool);
}

// O_DIRECT reads of each frame's aligned cover decode to the same bytes as
// buffered reads, every chunk whatever its offset's alignment; the cost counts
// the covers (whole 4 KiB blocks) and the decode time.
TEST(ChunkedFile, DirectReadsDecodeAlike) {
    TempDir t;
    const std::uint64_t sb = 12, n = 5000, cs = 300;
    const auto data = pattern(sb * n);
    write_file(t.path / "d.zc", data, sb, cs, 2);
    ChunkedReader r(t.path / "d.zc");
    if (!r.set_direct(true)) GTEST_SKIP() << "the filesystem of " << t.path << " refuses O_DIRECT";
    EXPECT_TRUE(r.direct());
    ChunkedReader::Cost cost;
    std::uint64_t frames = 0;
    for (std::uint64_t c = 0; c < r.chunks(); ++c) {
        std::vector<std::uint8_t> chunk(r.chunk_bytes(c));
        r.read_chunk(c, chunk.data(), &cost);
        EXPECT_TRUE(std::equal(chunk.begin(), chunk.end(), data.begin() + c * cs * sb)) << "chunk " << c;
        frames += r.index().chunks[c].compressed_bytes;
    }
    EXPECT_TRUE(r.direct()) << "no read was refused";
    EXPECT_EQ(cost.bytes % 4096, 0u);
    EXPECT_GE(cost.bytes, frames);
    EXPECT_GT(cost.decode_seconds, 0.0);
    r.drop_pages(0, n); // advice only: nothing to check but that it takes the whole range
    ASSERT_TRUE(r.set_direct(false));
    EXPECT_FALSE(r.direct());
    ChunkedReader::Cost buffered;
    std::vector<std::uint8_t> all(sb * n);
    r.read_chunk(0, all.data(), &buffered);
    EXPECT_EQ(buffered.bytes, r.index().chunks[0].compressed_bytes);
}

TEST(ChunkedFile, IdenticalWhateverTheThreadCount) {
    TempDir t;
    const auto data = pattern(8 * 5000);
    const std::string a = write_file(t.path / "1.zc", data, 8, 100, 1, 1000);
    const std::string b = write_file(t.path / "4.zc", data, 8, 100, 4, 37);
    EXPECT_EQ(a, b);
    EXPECT_EQ(slurp(t.path / "1.zc"), slurp(t.path / "4.zc"));
}

TEST(ChunkedFile, EmptyField) {
    TempDir t;
    write_file(t.path / "e.zc", {}, 4, 10, 1);
    ChunkedReader r(t.path / "e.zc");
    EXPECT_EQ(r.samples(), 0u);
    EXPECT_EQ(r.chunks(), 0u);
    r.verify();
}

TEST(ChunkedFile, CorruptChunkIsNamed) {
    TempDir t;
    const auto data = pattern(16 * 400);
    write_file(t.path / "c.zc", data, 16, 50, 2);
    std::uint64_t offset = 0;
    {
        ChunkedReader r(t.path / "c.zc");
        offset = r.index().chunks[5].offset + r.index().chunks[5].compressed_bytes / 2;
    }
    flip_byte(t.path / "c.zc", offset);
    ChunkedReader r(t.path / "c.zc");
    try {
        r.verify();
        FAIL() << "corruption not detected";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("chunk 5 of 8"), std::string::npos) << e.what();
        EXPECT_EQ(e.code(), ExitCode::failure);
    }
    std::vector<std::uint8_t> buf(16 * 50);
    EXPECT_NO_THROW(r.read_chunk(4, buf.data()));
    try {
        r.read_chunk(5, buf.data());
        FAIL() << "corruption not detected by read_chunk";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("chunk 5 of 8"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    }
}

// read_chunk trusts zstd's content checksum: a frame header whose checksum
// flag was cleared must not slip through unchecked.
TEST(ChunkedFile, FrameWithoutContentChecksumIsRejected) {
    TempDir t;
    write_file(t.path / "h.zc", pattern(16 * 400), 16, 50, 2);
    std::uint64_t offset = 0;
    {
        ChunkedReader r(t.path / "h.zc");
        offset = r.index().chunks[3].offset + 4; // the frame header descriptor
    }
    {
        std::fstream f(t.path / "h.zc", std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(static_cast<std::streamoff>(offset));
        char d = 0;
        f.read(&d, 1);
        ASSERT_TRUE(d & 0x04);
        d = static_cast<char>(d & ~0x04);
        f.seekp(static_cast<std::streamoff>(offset));
        f.write(&d, 1);
    }
    ChunkedReader r(t.path / "h.zc");
    std::vector<std::uint8_t> buf(16 * 50);
    EXPECT_NO_THROW(r.read_chunk(2, buf.data()));
    EXPECT_THROW(r.read_chunk(3, buf.data()), Error);
    EXPECT_THROW(r.verify(), Error);
}

TEST(ChunkedFile, TruncatedOrForeignFileIsRejected) {
    TempDir t;
    const auto data = pattern(16 * 400);
    write_file(t.path / "t.zc", data, 16, 50, 1);
    const auto size = fs::file_size(t.path / "t.zc");
    fs::resize_file(t.path / "t.zc", size - 5);
    EXPECT_THROW(ChunkedReader r(t.path / "t.zc"), Error);
    std::ofstream(t.path / "f.zc") << "this is not a chunked file at all, but long enough to have a header";
    EXPECT_THROW(ChunkedReader r(t.path / "f.zc"), Error);
}

TEST(ChunkedFile, IndexParserChecksEverything) {
    ChunkIndex ix;
    ix.samples = 10;
    ix.sample_bytes = 4;
    ix.chunk_samples = 4;
    ix.chunks = {{chunked_header_bytes, 10, 1}, {chunked_header_bytes + 10, 10, 2}, {chunked_header_bytes + 20, 7, 3}};
    const auto frame = serialize_chunk_index(ix);
    const std::uint64_t file = chunked_header_bytes + 27 + frame.size();
    const ChunkIndex back = parse_chunk_index(frame, file, "x");
    EXPECT_EQ(back.chunks.size(), 3u);
    EXPECT_EQ(back.chunks[2].checksum, 3u);
    EXPECT_THROW(parse_chunk_index(frame, file + 1, "x"), Error); // data does not end where the index starts
    for (std::size_t i = 0; i < frame.size(); ++i) {
        auto bad = frame;
        bad[i] ^= 1;
        EXPECT_THROW(parse_chunk_index(bad, file, "x"), Error) << "byte " << i;
    }
    ix.samples = 13; // needs 4 chunks
    EXPECT_THROW(parse_chunk_index(serialize_chunk_index(ix), file, "x"), Error);
}

TEST(ChunkedFile, ResumeKeepsCompleteChunks) {
    TempDir t;
    const std::uint64_t sb = 8, cs = 100, n = 1050;
    const auto data = pattern(sb * n);
    const std::string want = write_file(t.path / "full.zc", data, sb, cs, 2);
    ThreadPool pool(2);
    {
        ChunkedWriter w(t.path / "part.zc", sb, cs, 3, pool);
        w.append(data.data(), 730);
        w.flush(); // 7 chunks on disk, 30 samples buffered and lost
    }
    // A torn write after the last complete chunk.
    {
        std::ofstream f(t.path / "part.zc", std::ios::app | std::ios::binary);
        f << "garbage";
    }
    auto w = ChunkedWriter::resume(t.path / "part.zc", sb, cs, 3, pool, 700);
    EXPECT_EQ(w.written(), 700u);
    w.append(data.data() + 700 * sb, n - 700);
    EXPECT_EQ(w.finish(), want);
    EXPECT_EQ(slurp(t.path / "part.zc"), slurp(t.path / "full.zc"));
    EXPECT_THROW(ChunkedWriter::resume(t.path / "part.zc", sb, cs, 3, pool, 50), Error); // not on a chunk boundary
}
