// The field conversion on the host, and the statistics normalisation divides by.
#include "dstk/data/convert.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/units.hpp"
#include "dstk/widen.hpp"

namespace dstk::data {
namespace {

constexpr std::uint64_t stats_samples = 4096;

constexpr EnumNames<FieldKind, 5> kind_names{{{{FieldKind::stored, "stored"},
                                               {FieldKind::normalised, "normalised"},
                                               {FieldKind::values, "values"},
                                               {FieldKind::classes32, "classes32"},
                                               {FieldKind::classes64, "classes64"}}}};

void convert_one(const FieldConversion& f, std::uint32_t n) {
    const std::uint64_t count = f.per_sample * n;
    switch (f.kind) {
    case FieldKind::stored:
        std::memcpy(f.dst, f.src, count * dtype_size(f.dtype));
        return;
    case FieldKind::values:
        for (std::uint64_t i = 0; i < count; ++i) static_cast<float*>(f.dst)[i] = widen_float(f.src, f.dtype, i);
        return;
    case FieldKind::classes32:
        for (std::uint64_t i = 0; i < count; ++i) {
            const std::int64_t v = widen_int(f.src, f.dtype, i);
            static_cast<std::int32_t*>(f.dst)[i] =
                v >= 0 && v < std::numeric_limits<std::int32_t>::max() ? static_cast<std::int32_t>(v) : -1;
        }
        return;
    case FieldKind::classes64:
        for (std::uint64_t i = 0; i < count; ++i) static_cast<std::int64_t*>(f.dst)[i] = widen_int(f.src, f.dtype, i);
        return;
    case FieldKind::normalised:
        break;
    }
    const std::uint64_t stride = f.stride ? f.stride : f.per_sample;
    for (std::uint64_t i = 0; i < count; ++i) {
        const std::uint64_t s = i / f.per_sample, e = i % f.per_sample, c = e / f.hw;
        const float v = (widen_float(f.src, f.dtype, i) - f.mean[c]) * f.inv_std[c];
        const std::uint64_t at = s * stride + f.offset + e;
        if (f.bf16)
            static_cast<std::uint16_t*>(f.dst)[at] = float_to_bf16(v);
        else
            static_cast<float*>(f.dst)[at] = v;
    }
}

// Per-channel sums over up to 4,096 samples spread evenly over `split`; a
// non-finite value is bad data, named by its sample and field.
void scan(const Dataset& ds, const SplitInfo& split, const FieldInfo& f, std::uint64_t channels,
          std::vector<double>& sum, std::vector<double>& sq, double& n) {
    const FieldReader& r = ds.reader(split.name, f.name);
    const std::uint64_t take = std::min(split.samples, stats_samples);
    const std::uint64_t numel = f.shape.numel(), per_channel = numel / channels;
    std::vector<std::uint8_t> buf(f.sample_bytes());
    sum.assign(channels, 0.0);
    sq.assign(channels, 0.0);
    for (std::uint64_t k = 0; k < take; ++k) {
        const std::uint64_t sample = k * split.samples / take;
        r.read(sample, 1, buf.data());
        for (std::uint64_t e = 0; e < numel; ++e) {
            const double v = widen_float(buf.data(), f.dtype, e);
            if (!std::isfinite(v))
                throw runtime_error("split '" + split.name + "' field '" + f.name + "' sample " +
                                    std::to_string(sample) + " holds a non-finite value (" +
                                    (std::isnan(v) ? "NaN" : "Inf") + " at element " + std::to_string(e) +
                                    ": normalising needs finite values) fix or drop those samples");
            sum[e / per_channel] += v;
            sq[e / per_channel] += v * v;
        }
    }
    n = static_cast<double>(take * per_channel);
}

} // namespace

std::string_view field_kind_name(FieldKind k) {
    return kind_names.name(k);
}

DType converted_dtype(FieldKind k, DType stored) {
    switch (k) {
    case FieldKind::stored:
        return stored;
    case FieldKind::normalised:
    case FieldKind::values:
        return DType::f32;
    case FieldKind::classes32:
        return DType::i32;
    case FieldKind::classes64:
        return DType::i64;
    }
    return stored;
}

void convert_fields_host(std::span<const FieldConversion> fields, std::uint32_t n) {
    for (const FieldConversion& f : fields) {
        if (f.rows) throw std::logic_error("convert_fields_host: rows are device memory (a GPU source's)");
        convert_one(f, n);
    }
}

ChannelNorm field_norm(const Dataset& ds, const std::string& field, std::string_view scan_split) {
    const Manifest& m = ds.manifest();
    const SplitInfo* split = m.find(scan_split);
    if (!split && !m.splits.empty()) split = &m.splits.front();
    const FieldInfo& f = split->field(field);
    const std::uint64_t channels = stats_channels(f.shape);
    ChannelNorm norm;
    norm.per_channel = f.shape.numel() / channels;
    std::vector<double> sum, sq;
    double n = 0;
    const ChannelStats* stats = m.stats_of(field);
    if (stats && stats->mean.size() == channels && stats->std.size() == channels) {
        for (std::uint64_t c = 0; c < channels; ++c) {
            if (!std::isfinite(stats->mean[c]) || !std::isfinite(stats->std[c]))
                throw runtime_error(ds.dir().string() + ": " + manifest_file_name + " gives channel " +
                                    std::to_string(c) + " of '" + field +
                                    "' a non-finite mean or std (the data holds NaN or Inf?) re-create the dataset "
                                    "from finite values");
            norm.mean.push_back(static_cast<float>(stats->mean[c]));
            norm.std.push_back(static_cast<float>(std::max(stats->std[c], 1e-6)));
        }
        norm.source = "the manifest";
        if (is_float(f.dtype)) scan(ds, *split, f, channels, sum, sq, n);
        return norm;
    }
    if (split->samples == 0)
        throw usage_error("split '" + split->name + "' of " + ds.dir().string() + " is empty: no samples to compute '" +
                          field + "''s statistics from; give the mean and std, or turn normalisation off");
    scan(ds, *split, f, channels, sum, sq, n);
    for (std::uint64_t c = 0; c < channels; ++c) {
        const double mu = sum[c] / n;
        norm.mean.push_back(static_cast<float>(mu));
        norm.std.push_back(static_cast<float>(std::sqrt(std::max(sq[c] / n - mu * mu, 1e-12))));
    }
    norm.source = "a scan of " + format_count(std::min(split->samples, stats_samples)) + " samples of split '" +
                  split->name + "'";
    return norm;
}

} // namespace dstk::data
