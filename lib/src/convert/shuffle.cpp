#include "shuffle.hpp"

#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/rng.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk::convert {
namespace {
constexpr std::uint64_t bucket_target_bytes = 64ull << 20;
}

Shuffler::Shuffler(const fs::path& dir, std::uint64_t seed, std::uint64_t samples, const std::vector<FieldPlan>& fields)
    : dir_(dir), seed_(seed), fields_(fields) {
    for (const auto& f : fields) record_ += f.out_bytes;
    const std::uint64_t total = checked_mul(samples, record_, "shuffle size");
    buckets_ = std::max<std::uint64_t>(1, (total + bucket_target_bytes - 1) / bucket_target_bytes);
    buffer_cap_ = std::max<std::uint64_t>(record_, std::min<std::uint64_t>(1 << 20, bucket_target_bytes / buckets_));
    for (std::uint64_t b = 0; b < buckets_; ++b) {
        paths_.push_back(dir_ / ("shuffle-" + std::to_string(b)));
        register_temp_path(paths_.back());
        fds_.push_back(UniqueFd::open(paths_.back(), O_RDWR | O_CREAT | O_TRUNC, "cannot create shuffle bucket", 0600));
    }
    buffers_.resize(buckets_);
    counts_.assign(buckets_, 0);
}

Shuffler::~Shuffler() {
    for (std::size_t b = 0; b < paths_.size(); ++b) {
        if (b < fds_.size()) fds_[b].reset();
        ::unlink(paths_[b].c_str());
        unregister_temp_path(paths_[b]);
    }
}

void Shuffler::add(const std::vector<const std::uint8_t*>& data, std::uint64_t count) {
    for (std::uint64_t s = 0; s < count; ++s, ++next_) {
        const std::uint64_t b = (std::uint64_t{philox(seed_, 0x5348554646ull, next_)[0]} * buckets_) >> 32;
        auto& buf = buffers_[b];
        for (std::size_t f = 0; f < fields_.size(); ++f)
            buf.insert(buf.end(), data[f] + s * fields_[f].out_bytes, data[f] + (s + 1) * fields_[f].out_bytes);
        ++counts_[b];
        if (buf.size() >= buffer_cap_) spill(b);
    }
}

void Shuffler::drain(Router& router, std::uint64_t block) {
    for (std::uint64_t b = 0; b < buckets_; ++b) spill(b);
    for (std::uint64_t b = 0; b < buckets_; ++b) {
        throw_if_interrupted();
        emit_bucket(b, router, block);
    }
}

// Loads bucket b, permutes it, and routes it in blocks.
void Shuffler::emit_bucket(std::uint64_t b, Router& router, std::uint64_t block) {
    const std::uint64_t n = counts_[b];
    std::vector<std::uint8_t> all(n * record_);
    read_all(fds_[b].get(), all.data(), all.size(), 0, paths_[b]);
    fds_[b].reset();
    ::unlink(paths_[b].c_str());
    std::vector<std::uint64_t> perm(n);
    for (std::uint64_t i = 0; i < n; ++i) perm[i] = i;
    CounterRng rng(seed_, 1 + b);
    for (std::uint64_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
    std::vector<std::vector<std::uint8_t>> fields(fields_.size());
    for (std::uint64_t s0 = 0; s0 < n; s0 += block) {
        const std::uint64_t m = std::min(block, n - s0);
        std::vector<const std::uint8_t*> ptrs;
        for (std::size_t f = 0, at = 0; f < fields_.size(); at += fields_[f].out_bytes, ++f) {
            fields[f].resize(m * fields_[f].out_bytes);
            for (std::uint64_t s = 0; s < m; ++s)
                std::memcpy(fields[f].data() + s * fields_[f].out_bytes, all.data() + perm[s0 + s] * record_ + at,
                            fields_[f].out_bytes);
            ptrs.push_back(fields[f].data());
        }
        router.route(ptrs, m);
    }
}

void Shuffler::spill(std::uint64_t b) {
    auto& buf = buffers_[b];
    if (buf.empty()) return;
    write_all(fds_[b].get(), buf.data(), buf.size(), -1, paths_[b]);
    buf.clear();
}

} // namespace dstk::convert
