#pragma once
// What a dstrain run reports: per epoch and for the whole run (--json).
#include <cstdint>
#include <string>
#include <vector>

#include "dstk/train/trainer.hpp"

namespace dstk::run {

struct EpochReport {
    std::uint32_t epoch = 0;
    train::Metrics train, test;
    double seconds = 0.0, train_seconds = 0.0, samples_per_second = 0.0;
    float lr = 0.0f;
};

struct RunReport {
    std::string model, device, precision;
    std::uint64_t parameters = 0;
    std::uint64_t training_flops = 0; // per trained sample, in the matrix products (NetworkPlan::training_flops)
    train::MemoryPlan planned;
    std::uint64_t measured_device_bytes = 0;
    // The GPU memory ceiling (cuda): runtime overhead measured after the
    // warm-up + planned buffers (planned.total() + data); the peak measured
    // over the run, and how it was measured.
    std::uint64_t memory_ceiling = 0, runtime_overhead = 0, data_device_bytes = 0, peak_device_bytes = 0;
    std::string memory_method;
    std::vector<EpochReport> epochs;
    // Data parallel: this process's rank and the world size (figures above
    // are the world's: summed metrics and samples/s, the largest rank's peak).
    int rank = 0, ranks = 1;
    std::uint32_t global_batch = 0;
};

std::string run_report_json(const RunReport& r); // the --json document

} // namespace dstk::run
