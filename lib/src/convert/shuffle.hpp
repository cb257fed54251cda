#pragma once
// dsconvert --shuffle: an external-memory shuffle. Records (all fields of a
// sample, converted) are scattered into buckets on disk by a hash of (seed,
// sample index), then each bucket is loaded and permuted in memory. Uniform,
// deterministic, and memory bounded by one bucket.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "dstk/fd.hpp"
#include "field_plan.hpp"

namespace dstk::convert {

class Shuffler {
  public:
    Shuffler(const std::filesystem::path& dir, std::uint64_t seed, std::uint64_t samples,
             const std::vector<FieldPlan>& fields);
    ~Shuffler();
    Shuffler(const Shuffler&) = delete;
    Shuffler& operator=(const Shuffler&) = delete;

    void add(const std::vector<const std::uint8_t*>& data, std::uint64_t count);
    // Emits every sample, shuffled, in blocks of at most `block` samples.
    void drain(Router& router, std::uint64_t block);

  private:
    void spill(std::uint64_t b);
    void emit_bucket(std::uint64_t b, Router& router, std::uint64_t block);

    std::filesystem::path dir_;
    std::uint64_t seed_;
    const std::vector<FieldPlan>& fields_;
    std::uint64_t record_ = 0, buckets_ = 0, buffer_cap_ = 0, next_ = 0;
    std::vector<std::filesystem::path> paths_;
    std::vector<UniqueFd> fds_;
    std::vector<std::vector<std::uint8_t>> buffers_;
    std::vector<std::uint64_t> counts_;
};

} // namespace dstk::convert
