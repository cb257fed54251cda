#pragma once
// Counter-based random numbers: any value is a pure function of (seed, stream,
// counter), so sample i can be generated from (seed, i) alone, on any thread,
// in any order. Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC'11) for keys and per-sample parameters; a fast SplitMix64
// stream seeded from it for bulk per-element noise.
#include <array>
#include <cmath>
#include <cstdint>

namespace dstk {

using PhiloxBlock = std::array<std::uint32_t, 4>;

constexpr PhiloxBlock philox4x32_10(PhiloxBlock ctr, std::array<std::uint32_t, 2> key) {
    constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
    constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        const std::uint64_t p0 = std::uint64_t{m0} * ctr[0];
        const std::uint64_t p1 = std::uint64_t{m1} * ctr[2];
        ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
               static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
        key[0] += w0;
        key[1] += w1;
    }
    return ctr;
}

// 128 random bits for (seed, stream, counter).
constexpr PhiloxBlock philox(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
    return philox4x32_10({static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32),
                          static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                         {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

// A sequential generator for one (seed, stream): Philox blocks in counter order.
class CounterRng {
  public:
    constexpr CounterRng(std::uint64_t seed, std::uint64_t stream) : seed_(seed), stream_(stream) {}

    std::uint64_t next_u64() {
        if (have_ == 0) {
            block_ = philox(seed_, stream_, counter_++);
            have_ = 2;
        }
        --have_;
        const int i = have_ * 2;
        return (std::uint64_t{block_[i]} << 32) | block_[i + 1];
    }
    std::uint32_t next_u32() { return static_cast<std::uint32_t>(next_u64() >> 32); }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    // Uniform integer in [0, n) (Lemire's multiply-shift; bias < n / 2^64).
    std::uint64_t below(std::uint64_t n) {
        return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
    }
    // Standard normal (Box-Muller).
    double normal() {
        double u1 = uniform();
        while (u1 <= 0.0) u1 = uniform();
        const double u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

  private:
    std::uint64_t seed_, stream_, counter_ = 0;
    PhiloxBlock block_{};
    int have_ = 0;
};

// SplitMix64 (Steele, Lea, Flood 2014): one add and three mixes per 64 bits;
// used for bulk noise where Philox would dominate the cost.
class SplitMix64 {
  public:
    explicit constexpr SplitMix64(std::uint64_t state) : state_(state) {}
    constexpr std::uint64_t next() {
        std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

  private:
    std::uint64_t state_;
};

} // namespace dstk
