#include <bit>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "dstk/dtype.hpp"
#include "dstk/error.hpp"

using namespace dstk;

TEST(DType, NamesSizesAndDescrs) {
    EXPECT_EQ(dtype_size(DType::u8), 1u);
    EXPECT_EQ(dtype_size(DType::bf16), 2u);
    EXPECT_EQ(dtype_size(DType::f64), 8u);
    for (DType t : all_dtypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(parse_dtype("float32"), DType::f32);
    EXPECT_EQ(npy_descr(DType::f32), "<f4");
    EXPECT_EQ(npy_descr(DType::u8), "|u1");
    EXPECT_EQ(npy_descr(DType::bf16), "<u2");
    EXPECT_THROW(parse_dtype("u7"), Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
    EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
    EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
    // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1).
    EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f), 0x3F80);
    // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
    EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3F82);
    EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3F81);
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    // A NaN whose payload is only in the low bits must stay NaN, not become Inf.
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7F800001u)))));
    EXPECT_EQ(bf16_to_float(float_to_bf16(INFINITY)), INFINITY);
    EXPECT_EQ(bf16_to_float(float_to_bf16(-INFINITY)), -INFINITY);
    EXPECT_EQ(float_to_bf16(3.4e38f), 0x7F80); // rounds up to Inf
}

TEST(DType, F16RoundTripsEveryHalf) {
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_float(static_cast<std::uint16_t>(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f)))) << h;
            continue;
        }
        EXPECT_EQ(float_to_f16(f), h) << std::hex << h;
    }
}

TEST(DType, F16RoundsToNearestEven) {
    EXPECT_EQ(float_to_f16(1.0f), 0x3C00);
    EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
    EXPECT_EQ(float_to_f16(65519.0f), 0x7BFF);          // below the halfway point to 65536
    EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);          // halfway: rounds to even = Inf
    EXPECT_EQ(float_to_f16(1.0f + 0x1.0p-11f), 0x3C00); // tie to even
    EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1.0p-11f), 0x3C02);
    EXPECT_EQ(float_to_f16(0x1.0p-24f), 0x0001); // smallest subnormal
    EXPECT_EQ(float_to_f16(0x1.0p-25f), 0x0000); // tie to even: zero
    EXPECT_EQ(float_to_f16(0x1.8p-25f), 0x0001);
    EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(f16_to_float(0x0001), 0x1.0p-24f);
    EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
}
