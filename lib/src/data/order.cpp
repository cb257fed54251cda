#include "dstk/data/order.hpp"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"
#include "dstk/units.hpp"

namespace dstk::data {
namespace {

// Philox streams of the orders, so that no two keys coincide.
constexpr std::uint64_t stream_full = 0x66756c6cull;   // "full"
constexpr std::uint64_t stream_chunks = 0x63686e6bull; // "chnk"
constexpr std::uint64_t stream_window = 0x77696e64ull; // "wind", window index in the high bits

std::uint64_t key_of(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
    const PhiloxBlock b = philox(seed, stream, counter);
    return (std::uint64_t{b[0]} << 32) | b[1];
}

std::uint64_t mix64(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

} // namespace

constexpr EnumNames<Order, 3> order_names{
    {{{Order::sequential, "sequential"}, {Order::chunk, "chunk"}, {Order::full, "full"}}}};

Order parse_order(std::string_view text, std::string_view setting) {
    return order_names.parse(text, setting);
}

std::string_view order_name(Order o) {
    return order_names.name(o);
}

Permutation::Permutation(std::uint64_t n, std::uint64_t key) : n_(n) {
    unsigned bits = n > 1 ? static_cast<unsigned>(std::bit_width(n - 1)) : 1u;
    bits = std::max(2u, bits + (bits & 1u));
    half_bits_ = bits / 2;
    half_mask_ = half_bits_ >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << half_bits_) - 1;
    for (std::uint64_t r = 0; r < 4; ++r) keys_[r] = key_of(key, 0x66656973ull /* "feis" */, r);
}

std::uint64_t Permutation::round(std::uint64_t r, std::uint64_t half) const {
    return mix64(half + keys_[r]) & half_mask_;
}

std::uint64_t Permutation::forward_once(std::uint64_t x) const {
    std::uint64_t l = x >> half_bits_, r = x & half_mask_;
    for (std::uint64_t k = 0; k < 4; ++k) {
        const std::uint64_t t = l ^ round(k, r);
        l = r;
        r = t;
    }
    return (l << half_bits_) | r;
}

std::uint64_t Permutation::backward_once(std::uint64_t x) const {
    std::uint64_t l = x >> half_bits_, r = x & half_mask_;
    for (std::uint64_t k = 4; k-- > 0;) {
        const std::uint64_t t = r ^ round(k, l);
        r = l;
        l = t;
    }
    return (l << half_bits_) | r;
}

// Cycle-walking: a bijection of [0, 2^bits) restricted to [0, n) by applying it
// again until the value falls inside; the domain is under 4n, so this ends fast.
std::uint64_t Permutation::operator()(std::uint64_t i) const {
    if (n_ <= 1) return i;
    std::uint64_t x = forward_once(i);
    while (x >= n_) x = forward_once(x);
    return x;
}

std::uint64_t Permutation::inverse(std::uint64_t j) const {
    if (n_ <= 1) return j;
    std::uint64_t x = backward_once(j);
    while (x >= n_) x = backward_once(x);
    return x;
}

std::uint64_t RankSlice::batches(std::uint64_t samples, std::uint32_t batch, bool drop_last) const {
    if (world > 1 && !drop_last) throw std::logic_error("a sliced order drops its partial last batch");
    if (drop_last) return samples / (std::uint64_t{batch} * world);
    return (samples + batch - 1) / batch;
}

EpochOrder::EpochOrder(const OrderConfig& config, std::uint64_t samples, std::uint64_t epoch)
    : config_(config), n_(samples), epoch_(epoch),
      global_(config.kind == Order::full    ? samples
              : config.kind == Order::chunk ? (samples + std::max<std::uint64_t>(config.chunk_samples, 1) - 1) /
                                                  std::max<std::uint64_t>(config.chunk_samples, 1)
                                            : 1,
              key_of(config.seed, config.kind == Order::full ? stream_full : stream_chunks, epoch)) {
    if (config_.kind != Order::chunk) return;
    if (config_.chunk_samples == 0) throw usage_error("invalid chunk size 0 for the chunk order (must be positive)");
    if (config_.window_chunks == 0) throw usage_error("invalid window 0 (must be at least 1 chunk)");
    const std::uint64_t c = config_.chunk_samples;
    chunks_ = global_.size();
    tail_ = n_ % c;
    if (tail_ != 0) tail_slot_ = global_.inverse(chunks_ - 1);
    window_samples_ = checked_mul(c, config_.window_chunks, "the window times the chunk size");
}

// Windows before the one holding the partial last chunk are full; later ones
// start earlier by the samples that chunk lacks.
std::uint64_t EpochOrder::window_start(std::uint64_t w) const {
    const std::uint64_t start = w * window_samples_;
    if (tail_ != 0 && w > tail_slot_ / config_.window_chunks) return start - (config_.chunk_samples - tail_);
    return start;
}

EpochOrder::Window EpochOrder::window_of(std::uint64_t p) const {
    std::uint64_t w = p / window_samples_;
    if (tail_ != 0) {
        const std::uint64_t ws = tail_slot_ / config_.window_chunks;
        if (p >= window_start(ws + 1)) w = (p + (config_.chunk_samples - tail_)) / window_samples_;
    }
    const std::uint64_t first = window_start(w);
    const std::uint64_t end = std::min(window_start(w + 1), n_);
    return {w, first, end - first};
}

std::uint64_t EpochOrder::operator[](std::uint64_t p) const {
    switch (config_.kind) {
    case Order::sequential:
        return p;
    case Order::full:
        return global_(p);
    case Order::chunk:
        break;
    }
    const Window win = window_of(p);
    const Permutation local(win.positions, key_of(config_.seed, stream_window ^ (win.index << 32), epoch_));
    std::uint64_t r = local(p - win.first_position);
    const std::uint64_t c = config_.chunk_samples;
    const std::uint64_t first_slot = win.index * config_.window_chunks;
    std::uint64_t j = 0;
    if (tail_ != 0 && tail_slot_ >= first_slot && tail_slot_ - first_slot < config_.window_chunks) {
        const std::uint64_t js = tail_slot_ - first_slot;
        if (r < js * c) {
            j = r / c;
            r %= c;
        } else if (r < js * c + tail_) {
            j = js;
            r -= js * c;
        } else {
            r -= js * c + tail_;
            j = js + 1 + r / c;
            r %= c;
        }
    } else {
        j = r / c;
        r %= c;
    }
    return global_(first_slot + j) * c + r;
}

std::vector<std::uint64_t> EpochOrder::window_chunks(std::uint64_t p) const {
    if (config_.kind != Order::chunk) return {};
    const Window win = window_of(p);
    const std::uint64_t first_slot = win.index * config_.window_chunks;
    const std::uint64_t end_slot = std::min(first_slot + config_.window_chunks, chunks_);
    std::vector<std::uint64_t> out;
    for (std::uint64_t s = first_slot; s < end_slot; ++s) out.push_back(global_(s));
    std::sort(out.begin(), out.end());
    return out;
}

std::uint64_t EpochOrder::next_window_start(std::uint64_t p) const {
    if (config_.kind != Order::chunk) return n_;
    const Window win = window_of(p);
    return win.first_position + win.positions;
}

} // namespace dstk::data
