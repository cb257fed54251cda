#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <limits>
#include <vector>

#include "dstk/convert/convert.hpp"
#include "dstk/convert/dtype_kernels.hpp"
#include "dstk/error.hpp"
#include "dstk/convert/importers.hpp"

using namespace dstk;

namespace {

std::vector<float> awkward_floats() {
    std::vector<float> v = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.5f,
                            3.14159f,
                            1e-40f,
                            -1e-42f,
                            65504.0f,
                            65520.0f,
                            1e38f,
                            3.4e38f,
                            -3.4e38f,
                            1e-8f,
                            0.1f,
                            255.4999f,
                            255.5f,
                            256.5f,
                            -0.5f,
                            0.5f,
                            1.5f,
                            2.5f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
    std::uint32_t x = 1;
    for (int i = 0; i < 5000; ++i) {
        x = x * 1664525u + 1013904223u;
        float f;
        std::uint32_t bits = x;
        std::memcpy(&f, &bits, 4);
        v.push_back(f);
    }
    return v;
}

} // namespace

TEST(ConvertDtype, F32ToBf16MatchesTheReferenceRounding) {
    const auto in = awkward_floats();
    std::vector<std::uint16_t> out(in.size());
    ConversionStats s;
    convert_elements(DType::f32, DType::bf16, in.data(), out.data(), in.size(), {}, s);
    std::uint64_t nan = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
        if (std::isnan(in[i])) {
            ++nan;
            EXPECT_TRUE(std::isnan(bf16_to_float(out[i])));
        } else {
            EXPECT_EQ(out[i], float_to_bf16(in[i])) << in[i];
        }
    }
    EXPECT_EQ(s.nan, nan);
    EXPECT_EQ(s.elements, in.size());
    EXPECT_GT(s.overflow_inf, 0u); // 3.4e38 rounds up to Inf in bf16
    EXPECT_GT(s.max_rel_error, 0.0);
    EXPECT_LE(s.max_rel_error, 1.0); // subnormals may flush to 0
    std::vector<float> normal;
    for (float f : in)
        if (std::isnormal(f) && std::fabs(f) < 3e38f) normal.push_back(f);
    ConversionStats n;
    convert_elements(DType::f32, DType::bf16, normal.data(), out.data(), normal.size(), {}, n);
    EXPECT_GT(n.max_rel_error, 0.0);
    EXPECT_LE(n.max_rel_error, 1.0 / 256); // 8 significant bits, half an ulp
    EXPECT_EQ(s.bytes_out * 2, s.bytes_in);
}

TEST(ConvertDtype, F32ToF16AndBack) {
    const auto in = awkward_floats();
    std::vector<std::uint16_t> half(in.size());
    ConversionStats s;
    convert_elements(DType::f32, DType::f16, in.data(), half.data(), in.size(), {}, s);
    for (std::size_t i = 0; i < in.size(); ++i)
        if (!std::isnan(in[i])) EXPECT_EQ(half[i], float_to_f16(in[i])) << in[i];
    EXPECT_GT(s.overflow_inf, 0u); // 65520 and up
    std::vector<float> back(in.size());
    ConversionStats b;
    convert_elements(DType::f16, DType::f32, half.data(), back.data(), in.size(), {}, b);
    EXPECT_FALSE(b.lossy() && b.inexact > 0); // widening is exact
    EXPECT_EQ(b.nan, s.nan);
}

TEST(ConvertDtype, FloatToU8RoundsToEvenAndClips) {
    const std::vector<float> in = {-3.0f, 0.5f, 1.5f, 2.5f, 254.5f, 255.0f, 300.0f, NAN};
    std::vector<std::uint8_t> out(in.size());
    ConversionStats s;
    convert_elements(DType::f32, DType::u8, in.data(), out.data(), in.size(), {}, s);
    EXPECT_EQ(out, (std::vector<std::uint8_t>{0, 0, 2, 2, 254, 255, 255, 0}));
    EXPECT_EQ(s.clipped, 2u);
    EXPECT_EQ(s.nan, 1u);
    EXPECT_DOUBLE_EQ(s.max_abs_error, 45.0);
}

TEST(ConvertDtype, MappingAndRanges) {
    const std::vector<std::uint8_t> in = {0, 1, 128, 255};
    std::vector<float> out(in.size());
    ConversionStats s;
    convert_elements(DType::u8, DType::f32, in.data(), out.data(), in.size(), {1.0 / 255, 0}, s);
    EXPECT_FLOAT_EQ(out[3], 1.0f);
    EXPECT_FLOAT_EQ(out[2], 128.0f / 255);
    EXPECT_LT(s.max_abs_error, 1e-7);
    // And back with --range 0:1.
    const ValueMapping m = range_mapping(0.0, 1.0, DType::u8);
    std::vector<std::uint8_t> back(in.size());
    ConversionStats b;
    convert_elements(DType::f32, DType::u8, out.data(), back.data(), out.size(), m, b);
    EXPECT_EQ(back, in);
    EXPECT_EQ(b.clipped, 0u);
    double lo = INFINITY, hi = -INFINITY;
    const std::vector<float> r = {NAN, -2.0f, INFINITY, 7.0f};
    finite_range(DType::f32, r.data(), r.size(), lo, hi);
    EXPECT_EQ(lo, -2.0);
    EXPECT_EQ(hi, 7.0);
}

TEST(ConvertDtype, IntegerNarrowingClipsAndWideningIsExact) {
    const std::vector<std::int32_t> in = {-70000, -129, -128, 0, 127, 128, 70000};
    std::vector<std::int8_t> out(in.size());
    ConversionStats s;
    convert_elements(DType::i32, DType::i8, in.data(), out.data(), in.size(), {}, s);
    EXPECT_EQ(out, (std::vector<std::int8_t>{-128, -128, -128, 0, 127, 127, 127}));
    EXPECT_EQ(s.clipped, 4u);
    std::vector<std::int64_t> wide(in.size());
    ConversionStats w;
    convert_elements(DType::i32, DType::i64, in.data(), wide.data(), in.size(), {}, w);
    EXPECT_FALSE(w.lossy());
    EXPECT_EQ(wide[0], -70000);
    const std::vector<double> big = {1e19, -1e19};
    std::vector<std::int64_t> clip(2);
    ConversionStats c;
    convert_elements(DType::f64, DType::i64, big.data(), clip.data(), 2, {}, c);
    EXPECT_EQ(clip[0], std::numeric_limits<std::int64_t>::max());
    EXPECT_EQ(clip[1], std::numeric_limits<std::int64_t>::min());
}

TEST(ConvertOptionsParsing, SplitFractions) {
    const auto f = parse_split_fractions("train=0.9,test=0.1");
    ASSERT_EQ(f.size(), 2u);
    EXPECT_EQ(f[1].name, "test");
    for (const char* bad : {"", "train", "train=0.5", "train=0.5,train=0.5", "a=1.5,b=-0.5", "=1", "a=x"})
        EXPECT_THROW(parse_split_fractions(bad), Error) << bad;
}

TEST(ImportParsers, IdxHeader) {
    const std::uint8_t mnist[] = {0, 0, 8, 3, 0, 0, 0x27, 0x10, 0, 0, 0, 28, 0, 0, 0, 28};
    const IdxHeader h = parse_idx_header(mnist, "t");
    EXPECT_EQ(h.dtype, DType::u8);
    EXPECT_EQ(h.dims, (std::vector<std::uint64_t>{10000, 28, 28}));
    EXPECT_EQ(h.data_offset, 16u);
    const std::uint8_t bad_magic[] = {1, 0, 8, 1, 0, 0, 0, 1};
    EXPECT_THROW(parse_idx_header(bad_magic, "t"), Error);
    const std::uint8_t bad_type[] = {0, 0, 7, 1, 0, 0, 0, 1};
    EXPECT_THROW(parse_idx_header(bad_type, "t"), Error);
    const std::uint8_t cut[] = {0, 0, 8, 3, 0, 0, 0, 1, 0};
    EXPECT_THROW(parse_idx_header(cut, "t"), Error);
}

TEST(ImportParsers, ZipDirectoryRejectsGarbage) {
    std::vector<std::uint8_t> junk(100, 'x');
    EXPECT_THROW(parse_zip_directory(junk, junk.size(), "z"), Error);
    // An end record pointing outside the file.
    std::vector<std::uint8_t> eocd = {0x50, 0x4b, 5, 6, 0, 0, 0, 0, 1, 0, 1, 0, 46, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
    EXPECT_THROW(parse_zip_directory(eocd, eocd.size(), "z"), Error);
    // A zip64 locator whose record offset is near 2^64: offset + 56 wraps
    // around (found by fuzz_npz in CI); refused, not read out of bounds.
    std::vector<std::uint8_t> z64(20, 0);
    z64[0] = 0x50, z64[1] = 0x4b, z64[2] = 6, z64[3] = 7;
    z64[8] = 0xc8; // offset 2^64 - 56
    for (int k = 9; k < 16; ++k) z64[k] = 0xff;
    const std::uint8_t end[] = {0x50, 0x4b, 5, 6, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    z64.insert(z64.end(), std::begin(end), std::end(end));
    EXPECT_THROW(parse_zip_directory(z64, z64.size(), "z"), Error);
    EXPECT_EQ(cifar_record_count(3073 * 10, "c"), 10u);
    EXPECT_THROW(cifar_record_count(3073 * 10 - 1, "c"), Error);
}

// The vectorised f32 -> bf16 and u8 -> f32 kernels against a scalar reference:
// same bits, same error accounting, whatever the length (vector tails).
TEST(ConvertDtype, FastKernelsMatchAScalarReference) {
    const auto in = awkward_floats();
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{33}, in.size()}) {
        std::vector<std::uint16_t> out(n);
        ConversionStats s;
        convert_elements(DType::f32, DType::bf16, in.data(), out.data(), n, {}, s);
        std::uint64_t inexact = 0, overflow = 0, nan = 0;
        double max_abs = 0, max_rel = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const float f = in[i];
            if (std::isnan(f)) {
                ++nan;
                EXPECT_TRUE(std::isnan(bf16_to_float(out[i])));
                continue;
            }
            ASSERT_EQ(out[i], float_to_bf16(f)) << f;
            const float back = bf16_to_float(out[i]);
            if (std::isinf(back) && !std::isinf(f)) {
                ++overflow;
            } else if (back != f) {
                ++inexact;
                const float e = std::fabs(back - f);
                max_abs = std::max<double>(max_abs, e);
                max_rel = std::max<double>(max_rel, e / std::fabs(f));
            }
        }
        EXPECT_EQ(s.inexact, inexact) << n;
        EXPECT_EQ(s.overflow_inf, overflow) << n;
        EXPECT_EQ(s.nan, nan) << n;
        EXPECT_EQ(s.max_abs_error, max_abs) << n;
        EXPECT_EQ(s.max_rel_error, max_rel) << n;
    }
    // Inputs that miss some values (0..250; only 0, 3 and 255) and one with all
    // of them; mappings with no, few, most and all values inexact, so that
    // every accounting path of the u8 kernel (compare counts, memchr search,
    // histogram) is checked.
    std::vector<std::vector<std::uint8_t>> inputs(3, std::vector<std::uint8_t>(100003));
    for (std::size_t i = 0; i < inputs[0].size(); ++i) {
        inputs[0][i] = static_cast<std::uint8_t>((i * 37) % 251);
        inputs[1][i] = static_cast<std::uint8_t>(i * 7);
        inputs[2][i] = i % 3 == 0 ? 0 : i % 3 == 1 ? 255 : (i % 1001 == 2 ? 3 : 0);
    }
    for (const auto& bytes : inputs)
        for (const ValueMapping m : {ValueMapping{1.0 / 255, 0}, ValueMapping{1, 0}, ValueMapping{0.017, -0.5},
                                     ValueMapping{65795, 0}, ValueMapping{1, 16777216}}) {
            std::vector<float> out(bytes.size());
            ConversionStats s;
            convert_elements(DType::u8, DType::f32, bytes.data(), out.data(), bytes.size(), m, s);
            std::uint64_t inexact = 0;
            double max_abs = 0, max_rel = 0;
            for (std::size_t i = 0; i < bytes.size(); ++i) {
                const double exact = bytes[i] * m.scale + m.offset;
                ASSERT_EQ(out[i], static_cast<float>(exact)) << i;
                if (out[i] != exact) {
                    ++inexact;
                    max_abs = std::max(max_abs, std::fabs(out[i] - exact));
                    if (exact != 0) max_rel = std::max(max_rel, std::fabs(out[i] - exact) / std::fabs(exact));
                }
            }
            EXPECT_EQ(s.inexact, inexact);
            EXPECT_EQ(s.max_abs_error, max_abs);
            EXPECT_EQ(s.max_rel_error, max_rel);
            EXPECT_EQ(s.nan + s.clipped + s.overflow_inf, 0u);
        }
}

// u8 inputs take a table-lookup kernel for every output type; the same values
// as i32 go through the generic per-element loop: same bits, same accounting.
TEST(ConvertDtype, U8TableKernelMatchesTheGenericLoop) {
    std::vector<std::vector<std::uint8_t>> inputs(2, std::vector<std::uint8_t>(70001));
    for (std::size_t i = 0; i < inputs[0].size(); ++i) {
        inputs[0][i] = static_cast<std::uint8_t>(i * 7);
        inputs[1][i] = static_cast<std::uint8_t>((i % 5) * 50); // only 0, 50, 100, 150, 200
    }
    const DType outs[] = {DType::u8,  DType::i8,  DType::u16,  DType::i16, DType::i32,
                          DType::i64, DType::f16, DType::bf16, DType::f32, DType::f64};
    const ValueMapping maps[] = {{1, 0}, {1.0 / 255, 0}, {0.017, -0.5}, {65795, 0}, {1, 16777216}, {300, -1000}};
    for (const auto& bytes : inputs) {
        std::vector<std::int32_t> ints(bytes.begin(), bytes.end());
        for (DType to : outs)
            for (const ValueMapping& m : maps) {
                if (to == DType::u8 && m.identity()) continue; // a copy
                const std::size_t eo = dtype_size(to);
                std::vector<std::uint8_t> a(bytes.size() * eo), b(bytes.size() * eo);
                ConversionStats sa, sb;
                convert_elements(DType::u8, to, bytes.data(), a.data(), bytes.size(), m, sa);
                convert_elements(DType::i32, to, ints.data(), b.data(), ints.size(), m, sb);
                const std::string what = std::string(dtype_name(to)) + " scale " + std::to_string(m.scale) +
                                         " offset " + std::to_string(m.offset);
                EXPECT_EQ(a, b) << what;
                EXPECT_EQ(sa.inexact, sb.inexact) << what;
                EXPECT_EQ(sa.clipped, sb.clipped) << what;
                EXPECT_EQ(sa.overflow_inf, sb.overflow_inf) << what;
                EXPECT_EQ(sa.nan, sb.nan) << what;
                EXPECT_EQ(sa.max_abs_error, sb.max_abs_error) << what;
                EXPECT_EQ(sa.max_rel_error, sb.max_rel_error) << what;
                EXPECT_EQ(sa.bytes_out, sb.bytes_out) << what;
            }
    }
}

// f16 and bf16 widen to f32 exactly, through their fast kernels: every one
// of the 65536 bit patterns against the scalar definition (NaN quieted and
// counted).
TEST(ConvertDtype, HalfWideningCoversEveryValue) {
    std::vector<std::uint16_t> all(65536);
    for (std::uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<std::uint16_t>(h);
    for (DType from : {DType::f16, DType::bf16}) {
        std::vector<std::uint32_t> out(all.size());
        ConversionStats s;
        convert_elements(from, DType::f32, all.data(), out.data(), all.size(), {}, s);
        std::uint64_t nan = 0;
        for (std::uint32_t h = 0; h < 65536; ++h) {
            const float f = from == DType::f16 ? f16_to_float(static_cast<std::uint16_t>(h))
                                               : bf16_to_float(static_cast<std::uint16_t>(h));
            if (std::isnan(f)) {
                ++nan;
                float got;
                std::memcpy(&got, &out[h], 4);
                ASSERT_TRUE(std::isnan(got)) << h;
                ASSERT_TRUE(out[h] & 0x400000u) << "NaN not quiet: " << h;
                continue;
            }
            std::uint32_t want;
            std::memcpy(&want, &f, 4);
            ASSERT_EQ(out[h], want) << dtype_name(from) << " " << h;
        }
        EXPECT_EQ(s.nan, nan);
        EXPECT_EQ(s.inexact + s.clipped + s.overflow_inf, 0u);
        EXPECT_EQ(s.bytes_out, 4u * all.size());
    }
}

// The branch-free f32 -> f16 kernel against dstk::float_to_f16 and a scalar
// accounting (as the bf16 kernel's): awkward values, every f16 subnormal and
// rounding boundary region, random bit patterns.
TEST(ConvertDtype, F32ToF16KernelMatchesTheScalarReference) {
    std::vector<float> in = awkward_floats();
    for (std::uint32_t h = 0; h < 0x7C00; h += 7) { // around every 7th half value, and halfway points
        const float f = f16_to_float(static_cast<std::uint16_t>(h));
        const float g = f16_to_float(static_cast<std::uint16_t>(h + 1));
        in.insert(in.end(), {f, -f, (f + g) / 2, std::nextafter((f + g) / 2, 0.0f), std::nextafter((f + g) / 2, 1e9f)});
    }
    std::uint64_t x = 99;
    for (int i = 0; i < 20000; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const auto bits = static_cast<std::uint32_t>(x >> 32);
        float f;
        std::memcpy(&f, &bits, 4);
        in.push_back(f);
    }
    std::vector<std::uint16_t> out(in.size());
    ConversionStats s;
    convert_elements(DType::f32, DType::f16, in.data(), out.data(), in.size(), {}, s);
    std::uint64_t inexact = 0, overflow = 0, nan = 0;
    float max_abs = 0, max_rel = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
        const float f = in[i];
        ASSERT_EQ(out[i], float_to_f16(f)) << f << " at " << i;
        if (std::isnan(f)) {
            ++nan;
            continue;
        }
        const float back = f16_to_float(out[i]);
        if (std::isinf(back) && !std::isinf(f)) {
            ++overflow;
        } else if (back != f) {
            ++inexact;
            const float e = std::fabs(back - f);
            max_abs = std::max(max_abs, e);
            max_rel = std::max(max_rel, e / std::fabs(f));
        }
    }
    EXPECT_EQ(s.inexact, inexact);
    EXPECT_EQ(s.overflow_inf, overflow);
    EXPECT_EQ(s.nan, nan);
    EXPECT_EQ(s.max_abs_error, max_abs);
    EXPECT_EQ(s.max_rel_error, max_rel);
}
