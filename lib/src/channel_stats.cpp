#include "dstk/channel_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dstk/error.hpp"

namespace dstk {
namespace {

__attribute__((target_clones("avx2", "default"))) void sum_u8(const unsigned char* p, std::uint64_t n,
                                                              std::uint64_t& sum, std::uint64_t& sumsq) {
    // 32-bit partial sums vectorise; flush them before they can overflow.
    for (std::uint64_t i0 = 0; i0 < n; i0 += 65536) {
        const std::uint64_t end = std::min(n, i0 + 65536);
        std::uint32_t s = 0, s2 = 0;
        for (std::uint64_t j = i0; j < end; ++j) {
            s += p[j];
            s2 += std::uint32_t{p[j]} * p[j];
        }
        sum += s;
        sumsq += s2;
    }
}

template <typename T> double value_at(const unsigned char* p, std::uint64_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return static_cast<double>(v);
}

double half_at(const unsigned char* p, std::uint64_t i, bool brain) {
    std::uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return static_cast<double>(brain ? bf16_to_float(h) : f16_to_float(h));
}

// One channel of one sample: `n` values from p.
template <typename Get> void add_channel(const unsigned char* p, std::uint64_t n, Get get, double& sum, double& sumsq) {
    double s = 0, s2 = 0;
    for (std::uint64_t j = 0; j < n; ++j) {
        const double v = get(p, j);
        s += v;
        s2 += v * v;
    }
    sum += s;
    sumsq += s2;
}

template <typename Get>
void add_samples(const unsigned char* p, std::uint64_t count, std::uint64_t channels, std::uint64_t per,
                 std::size_t elem, Get get, double* sum, double* sumsq) {
    if (per == 1) { // a vector of features: one value per channel, added straight (the same sums)
        for (std::uint64_t i = 0; i < count; ++i)
            for (std::uint64_t c = 0; c < channels; ++c) {
                const double v = get(p, i * channels + c);
                sum[c] += v;
                sumsq[c] += v * v;
            }
        return;
    }
    for (std::uint64_t i = 0; i < count; ++i)
        for (std::uint64_t c = 0; c < channels; ++c)
            add_channel(p + (i * channels + c) * per * elem, per, get, sum[c], sumsq[c]);
}

} // namespace

void ChannelSums::add(const std::vector<double>& row) {
    if (row.size() != 2 * sum_.size())
        throw runtime_error("per-chunk sums of " + std::to_string(row.size() / 2) + " channels where " +
                            std::to_string(sum_.size()) + " were expected (parts of different datasets?)");
    for (std::size_t c = 0; c < sum_.size(); ++c) {
        sum_[c] += row[c];
        sumsq_[c] += row[sum_.size() + c];
    }
}

ChannelStats ChannelSums::stats(double n) const {
    ChannelStats st;
    for (std::size_t c = 0; c < sum_.size(); ++c) {
        const double mean = sum_[c] / n;
        st.mean.push_back(mean);
        st.std.push_back(std::sqrt(std::max(0.0, sumsq_[c] / n - mean * mean)));
    }
    return st;
}

std::vector<double> channel_sums_row(const void* samples, std::uint64_t count, DType t, const Shape& shape) {
    std::vector<double> row(2 * stats_channels(shape), 0.0);
    add_channel_sums(row, samples, count, t, shape);
    return row;
}

void add_channel_sums(std::vector<double>& row, const void* samples, std::uint64_t count, DType t, const Shape& shape) {
    const std::uint64_t channels = stats_channels(shape), per = shape.numel() / channels;
    if (row.size() != 2 * channels) throw runtime_error("internal: a row of channel sums of the wrong size");
    double* sum = row.data();
    double* sumsq = row.data() + channels;
    const auto* p = static_cast<const unsigned char*>(samples);
    const std::size_t elem = dtype_size(t);
    switch (t) {
    case DType::u8: // exact integer sums: cheap and order-independent
        if (per == 1) {
            add_samples(p, count, channels, per, elem, value_at<std::uint8_t>, sum, sumsq);
            break;
        }
        for (std::uint64_t i = 0; i < count; ++i)
            for (std::uint64_t c = 0; c < channels; ++c) {
                std::uint64_t s = 0, s2 = 0;
                sum_u8(p + (i * channels + c) * per, per, s, s2);
                sum[c] += static_cast<double>(s);
                sumsq[c] += static_cast<double>(s2);
            }
        break;
    case DType::i8:
        add_samples(p, count, channels, per, elem, value_at<std::int8_t>, sum, sumsq);
        break;
    case DType::u16:
        add_samples(p, count, channels, per, elem, value_at<std::uint16_t>, sum, sumsq);
        break;
    case DType::i16:
        add_samples(p, count, channels, per, elem, value_at<std::int16_t>, sum, sumsq);
        break;
    case DType::i32:
        add_samples(p, count, channels, per, elem, value_at<std::int32_t>, sum, sumsq);
        break;
    case DType::i64:
        add_samples(p, count, channels, per, elem, value_at<std::int64_t>, sum, sumsq);
        break;
    case DType::f16:
    case DType::bf16: {
        const bool brain = t == DType::bf16;
        add_samples(
            p, count, channels, per, elem,
            [brain](const unsigned char* q, std::uint64_t i) { return half_at(q, i, brain); }, sum, sumsq);
        break;
    }
    case DType::f32:
        add_samples(p, count, channels, per, elem, value_at<float>, sum, sumsq);
        break;
    case DType::f64:
        add_samples(p, count, channels, per, elem, value_at<double>, sum, sumsq);
        break;
    }
}

std::optional<ChannelStats> usable_stats(ChannelStats s, std::string& why) {
    for (std::size_t c = 0; c < s.mean.size(); ++c) {
        if (!std::isfinite(s.mean[c]) || !std::isfinite(s.std[c])) {
            why = "channel " + std::to_string(c) + " holds NaN or Inf values";
            return std::nullopt;
        }
        if (!(s.std[c] > 0)) {
            why = "channel " + std::to_string(c) + " is constant (std 0)";
            return std::nullopt;
        }
    }
    return s;
}

ChannelStats combine_stats(const std::vector<ChannelStats>& members, const std::vector<std::uint64_t>& samples) {
    if (members.empty() || members.size() != samples.size())
        throw runtime_error("internal: combine_stats needs one sample count per member");
    const std::size_t channels = members.front().mean.size();
    double total = 0;
    for (std::size_t k = 0; k < members.size(); ++k) {
        if (members[k].mean.size() != channels || members[k].std.size() != channels)
            throw runtime_error("internal: combine_stats of members with different channel counts");
        total += static_cast<double>(samples[k]);
    }
    ChannelStats out;
    for (std::size_t c = 0; c < channels; ++c) {
        double mean = 0;
        for (std::size_t k = 0; k < members.size(); ++k) mean += members[k].mean[c] * static_cast<double>(samples[k]);
        mean /= total;
        // Within-member variance plus the spread of the members' means.
        double var = 0;
        for (std::size_t k = 0; k < members.size(); ++k) {
            const double d = members[k].mean[c] - mean;
            var += static_cast<double>(samples[k]) * (members[k].std[c] * members[k].std[c] + d * d);
        }
        out.mean.push_back(mean);
        out.std.push_back(std::sqrt(var / total));
    }
    return out;
}

} // namespace dstk
