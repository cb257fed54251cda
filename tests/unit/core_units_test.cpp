#include <gtest/gtest.h>

#include "dstk/error.hpp"
#include "dstk/shape.hpp"
#include "dstk/units.hpp"

using namespace dstk;

TEST(Units, SizesUseBinaryAndDecimalPrefixes) {
    EXPECT_EQ(parse_size("0"), 0u);
    EXPECT_EQ(parse_size("512"), 512u);
    EXPECT_EQ(parse_size("512B"), 512u);
    EXPECT_EQ(parse_size("1K"), 1024u);
    EXPECT_EQ(parse_size("128G"), 128ull << 30);
    EXPECT_EQ(parse_size("128GiB"), 128ull << 30);
    EXPECT_EQ(parse_size("128GB"), 128'000'000'000ull);
    EXPECT_EQ(parse_size("2T"), 2ull << 40);
    EXPECT_EQ(parse_size("2TB"), 2'000'000'000'000ull);
    EXPECT_EQ(parse_size("1.5M"), 1536ull * 1024);
    EXPECT_EQ(parse_size("4k"), 4096u);
}

TEST(Units, CountsArePowersOfTen) {
    EXPECT_EQ(parse_count("10M"), 10'000'000u);
    EXPECT_EQ(parse_count("50K"), 50'000u);
    EXPECT_EQ(parse_count("2G"), 2'000'000'000u);
    EXPECT_EQ(parse_count("1.5M"), 1'500'000u);
    EXPECT_EQ(parse_count("123"), 123u);
}

TEST(Units, BadInputIsAUsageError) {
    for (const char* s : {"", "-1", "abc", "1Q", "1.2.3", "K", "99999999999999999999999"}) {
        try {
            parse_size(s, "--ram");
            ADD_FAILURE() << "accepted '" << s << "'";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << s;
            EXPECT_NE(std::string(e.what()).find("--ram"), std::string::npos) << e.what();
        }
    }
    EXPECT_THROW(parse_count("1.5"), Error);
    EXPECT_THROW(parse_count("-3"), Error);
    EXPECT_THROW(parse_count("3GiB"), Error);
    EXPECT_THROW(parse_size("18446744073709551616"), Error);
    EXPECT_THROW(parse_size("20000P"), Error);
}

TEST(Units, MemorySizeWithoutUnitBelowOneMiBIsRefused) {
    try {
        parse_memory_size("128", "--ram");
        ADD_FAILURE() << "accepted --ram 128";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("did you mean 128G?"), std::string::npos) << e.what();
    }
    EXPECT_EQ(parse_memory_size("0"), 0u); // "none": callers that need a positive size say so
    EXPECT_EQ(parse_memory_size("128G"), 128ull << 30);
    EXPECT_EQ(parse_memory_size("512K"), 512u << 10); // a unit: meant, however small
    EXPECT_EQ(parse_memory_size("512B"), 512u);
    EXPECT_EQ(parse_memory_size("1048576"), 1u << 20);
    EXPECT_THROW(parse_memory_size("1048575"), Error);
}

TEST(Units, FormatsIec) {
    EXPECT_EQ(format_bytes(0), "0 B");
    EXPECT_EQ(format_bytes(1023), "1023 B");
    EXPECT_EQ(format_bytes(1024), "1.0 KiB");
    EXPECT_EQ(format_bytes(122'880'000'000ull), "114.4 GiB"); // 10M x 3x32x32 f32: the seeds' "114 GB"
    EXPECT_EQ(format_bytes((1ull << 40) - 1), "1.0 TiB");
    EXPECT_EQ(format_count(10'000'000), "10,000,000");
    EXPECT_EQ(format_count(999), "999");
    EXPECT_EQ(format_count(1000), "1,000");
}

TEST(Units, CheckedArithmeticNeverWraps) {
    EXPECT_EQ(checked_mul(1ull << 32, 1ull << 31, "x"), 1ull << 63);
    EXPECT_THROW(checked_mul(1ull << 32, 1ull << 32, "x"), Error);
    EXPECT_THROW(checked_add(~0ull, 1, "x"), Error);
    // count x shape x dtype that overflows: an error, not a wrap.
    const Shape s = parse_shape("100000x100000x100000");
    EXPECT_THROW(checked_mul(10'000'000'000ull, sample_bytes(s, DType::f32), "dataset"), Error);
    EXPECT_EQ(sample_bytes(parse_shape("3x32x32"), DType::f32), 12288u);
    EXPECT_EQ(checked_mul(10'000'000, sample_bytes(parse_shape("3x32x32"), DType::f32), "d"), 122'880'000'000ull);
}

TEST(Shape, ParsesAndPrints) {
    EXPECT_EQ(parse_shape("3x32x32").dims, (std::vector<std::uint64_t>{3, 32, 32}));
    EXPECT_EQ(parse_shape("784").str(), "784");
    EXPECT_EQ(parse_shape("scalar").dims.size(), 0u);
    EXPECT_EQ(Shape{}.numel(), 1u);
    EXPECT_EQ(parse_shape("3x32x32").str(), "3x32x32");
    for (const char* bad : {"", "x", "3x", "3xx2", "0", "3x-1", "axb", "1x2x3x4x5x6x7x8x9"})
        EXPECT_THROW(parse_shape(bad), Error) << bad;
    EXPECT_THROW(parse_shape("4294967296x4294967296x2"), Error);
}
