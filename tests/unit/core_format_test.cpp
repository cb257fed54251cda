// The dataset format: .npy headers, the manifest, the reader and the writer.
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <gtest/gtest.h>

#include "dstk/atomic_output.hpp"
#include "dstk/dataset.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "dstk/npy.hpp"
#include "support/error_of.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using test_support::error_of;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        char tmpl[] = "/tmp/dstk-test-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { fs::remove_all(path); }
};

std::span<const std::uint8_t> bytes(const std::string& s) {
    return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// A dataset with 10 train samples of 2x3 f32 (x[i][j] = i * 100 + j) and i32 labels.
void write_small(const fs::path& dir) {
    DatasetWriter w(dir, false);
    Manifest m;
    m.num_classes = 3;
    auto xw = w.npy_field("train", "x", DType::f32, Shape{{2, 3}}, 10);
    auto yw = w.npy_field("train", "y", DType::i32, Shape{}, 10);
    for (int i = 0; i < 10; ++i) {
        float x[6];
        for (int j = 0; j < 6; ++j) x[j] = static_cast<float>(i * 100 + j);
        const std::int32_t y = i % 3;
        xw->append(x, 1);
        yw->append(&y, 1);
    }
    SplitInfo s{"train", 10, {xw->finish(), yw->finish()}};
    m.splits.push_back(s);
    m.provenance.tool = "test";
    w.commit(m);
}

} // namespace

TEST(Npy, HeaderRoundTripIsAlignedTo64) {
    for (DType t : all_dtypes) {
        const std::string h = make_npy_header(t, {10, 3, 32, 32});
        EXPECT_EQ(h.size() % 64, 0u);
        const NpyHeader p = parse_npy_header(bytes(h), "x.npy");
        EXPECT_EQ(p.shape, (std::vector<std::uint64_t>{10, 3, 32, 32}));
        EXPECT_EQ(p.data_offset, h.size());
        EXPECT_FALSE(p.fortran_order);
        EXPECT_EQ(p.descr, npy_descr(t));
    }
    const NpyHeader one = parse_npy_header(bytes(make_npy_header(DType::i32, {7})), "y.npy");
    EXPECT_EQ(one.shape, (std::vector<std::uint64_t>{7}));
    const NpyHeader scalar = parse_npy_header(bytes(make_npy_header(DType::i32, {})), "s.npy");
    EXPECT_TRUE(scalar.shape.empty());
}

TEST(Npy, ReadsWhatNumpyWrites) {
    // Written by numpy 1.24 (np.save of np.zeros((2, 3), '>f8', order='F')), 2.0 header too.
    std::string v1 =
        std::string("\x93NUMPY\x01\x00v\x00", 10) + "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 3), }";
    v1.append(128 - v1.size() - 1, ' ');
    v1 += '\n';
    const NpyHeader h = parse_npy_header(bytes(v1), "f.npy");
    EXPECT_TRUE(h.big_endian);
    EXPECT_TRUE(h.fortran_order);
    EXPECT_EQ(h.dtype, DType::f64);
    EXPECT_EQ(h.data_offset, 128u);
    std::string v2 = std::string("\x93NUMPY\x02\x00t\x00\x00\x00", 12) +
                     "{'descr': '<i8', 'fortran_order': False, 'shape': (5L,), }";
    v2.append(128 - v2.size() - 1, ' ');
    v2 += '\n';
    EXPECT_EQ(parse_npy_header(bytes(v2), "v2.npy").shape, (std::vector<std::uint64_t>{5}));
}

TEST(Npy, RejectsMalformedHeadersWithTheFileName) {
    const std::string good = make_npy_header(DType::f32, {4, 4});
    EXPECT_NE(error_of([&] { parse_npy_header(bytes("NUMPY\x01\x00"), "bad.npy"); }).find("bad.npy"),
              std::string::npos);
    EXPECT_NE(error_of([&] { parse_npy_header(bytes(good.substr(0, 30)), "t.npy"); }).find("truncated"),
              std::string::npos);
    std::string wrong = good;
    wrong.replace(wrong.find("<f4"), 3, "<c8");
    EXPECT_NE(error_of([&] { parse_npy_header(bytes(wrong), "c.npy"); }).find("unsupported .npy dtype"),
              std::string::npos);
    std::string huge = std::string("\x93NUMPY\x01\x00", 8) + std::string("\x40\x00", 2) +
                       "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }";
    huge.resize(10 + 64, ' ');
    EXPECT_NE(error_of([&] { parse_npy_header(bytes(huge), "h.npy"); }), "");
}

TEST(Manifest, RoundTripsAndValidates) {
    Manifest m;
    m.num_classes = 10;
    m.stats = ChannelStats{{1, 2, 3}, {4, 5, 6}};
    m.provenance.tool = "dsgen";
    m.provenance.seed = 9;
    m.provenance.params["kind"] = "images";
    FieldInfo x{"x", DType::u8, Shape{{3, 32, 32}}, Storage::npy, "train_x.npy", 3072 * 5 + 128, "xxh64:00", 0};
    m.splits.push_back({"train", 5, {x}});
    const Manifest back = parse_manifest(serialize_manifest(m), "dataset.json");
    EXPECT_EQ(back.splits.at(0).fields.at(0).shape, x.shape);
    EXPECT_EQ(back.splits.at(0).samples, 5u);
    EXPECT_EQ(*back.num_classes, 10u);
    EXPECT_EQ(back.stats->std, (std::vector<double>{4, 5, 6}));
    EXPECT_EQ(back.provenance.params.at("kind"), "images");
    EXPECT_EQ(*back.provenance.seed, 9u);

    const auto err = [](const std::string& text) { return error_of([&] { parse_manifest(text, "m.json"); }); };
    EXPECT_NE(err("{").find("not valid JSON"), std::string::npos);
    // Found by fuzz_manifest: a number too large for a double is an error, not a crash.
    EXPECT_NE(err("222222222e2222").find("not valid JSON"), std::string::npos);
    EXPECT_NE(err(R"({"format_version": 1, "splits": [{"name": "a", "samples": 1e999}]})").find("m.json"),
              std::string::npos);
    EXPECT_NE(err("{\"format_version\": 2, \"splits\": []}").find("not supported"), std::string::npos);
    EXPECT_NE(err("{\"format_version\": 1}").find("missing \"splits\""), std::string::npos);
    const std::string bad_dtype = R"({"format_version":1,"splits":[{"name":"train","samples":1,"fields":[
        {"name":"x","dtype":"u9","shape":[1],"storage":"npy","file":"a.npy","bytes":1}]}]})";
    EXPECT_NE(err(bad_dtype).find("splits[0].fields[0].dtype"), std::string::npos);
    const std::string escape = R"({"format_version":1,"splits":[{"name":"train","samples":1,"fields":[
        {"name":"x","dtype":"u8","shape":[1],"storage":"npy","file":"../etc/passwd","bytes":1}]}]})";
    EXPECT_NE(err(escape).find("plain file name"), std::string::npos);
    const std::string overflow =
        R"({"format_version":1,"splits":[{"name":"train","samples":18446744073709551615,"fields":[
        {"name":"x","dtype":"f64","shape":[1000],"storage":"npy","file":"a.npy","bytes":1}]}]})";
    EXPECT_NE(err(overflow).find("overflows"), std::string::npos);
}

TEST(Dataset, WriterAndReaderRoundTrip) {
    TempDir t;
    const fs::path dir = t.path / "ds";
    write_small(dir);
    const Dataset d = Dataset::open(dir);
    EXPECT_EQ(d.manifest().split("train").samples, 10u);
    float x[3 * 6];
    d.read("train", "x", 4, 3, x);
    EXPECT_EQ(x[0], 400.0f);
    EXPECT_EQ(x[17], 605.0f);
    std::int32_t y[10];
    d.read("train", "y", 0, 10, y);
    EXPECT_EQ(y[5], 2);
    EXPECT_THROW(d.read("train", "x", 8, 3, x), Error);
    EXPECT_THROW(d.read("test", "x", 0, 1, x), Error);
    EXPECT_NO_THROW(verify_dataset(dir));
    // No temporary directory is left beside the output.
    for (const auto& e : fs::directory_iterator(t.path)) EXPECT_EQ(e.path().filename(), "ds");
}

TEST(Dataset, OpenNamesTheFileAndTheMismatch) {
    TempDir t;
    const fs::path dir = t.path / "ds";
    write_small(dir);
    fs::resize_file(dir / "train_x.npy", fs::file_size(dir / "train_x.npy") - 8);
    const std::string e = error_of([&] { Dataset::open(dir); });
    EXPECT_NE(e.find("train_x.npy"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    EXPECT_NE(error_of([&] { Dataset::open(t.path / "nope"); }).find("not a dataset directory"), std::string::npos);
}

TEST(Dataset, VerifyCatchesAFlippedByte) {
    TempDir t;
    const fs::path dir = t.path / "ds";
    write_small(dir);
    {
        std::fstream f(dir / "train_x.npy", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(200);
        f.put('\x7f');
    }
    const std::string e = error_of([&] { verify_dataset(dir); });
    EXPECT_NE(e.find("checksum"), std::string::npos) << e;
    EXPECT_NE(e.find("train_x.npy"), std::string::npos) << e;
}

TEST(AtomicOutput, NothingAppearsUnlessCommitted) {
    TempDir t;
    {
        AtomicDir d(t.path / "out", false);
        std::ofstream(d.file("a")) << "x";
    }
    EXPECT_TRUE(fs::is_empty(t.path));
    {
        AtomicFile f(t.path / "f.txt", false);
        f.write("hello", 5);
        f.commit();
    }
    EXPECT_EQ(fs::file_size(t.path / "f.txt"), 5u);
    try {
        AtomicFile again(t.path / "f.txt", false);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos);
    }
    AtomicFile forced(t.path / "f.txt", true);
    forced.write("hi", 2);
    forced.commit();
    EXPECT_EQ(fs::file_size(t.path / "f.txt"), 2u);
}

TEST(AtomicOutput, WriteErrorsNameTheFile) {
    const int fd = ::open("/dev/full", O_WRONLY);
    if (fd < 0) GTEST_SKIP() << "no /dev/full here";
    char buf[4096] = {};
    const std::string e = error_of([&] { write_all(fd, buf, sizeof buf, -1, "/dev/full"); });
    ::close(fd);
    EXPECT_NE(e.find("/dev/full"), std::string::npos) << e;
    EXPECT_NE(e.find("No space"), std::string::npos) << e;
}
