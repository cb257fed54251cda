#pragma once
// The one entrance to the data path (DESIGN.md, "The training data path").
// Every caller (dstrain, dsbench's loader cases, dsplan, dstk.Loader) says
// what it wants in a SourceRequest and gets a SourcePlan from plan_source,
// which decides, once and by the same rules for all:
//
//   placement  auto: device while the split (every delivered field) fits the
//              room (90% of the GPU's free memory less what the caller
//              reserves for its model; on the cpu backend half of the host
//              memory available), else stream
//   chunk      the order's chunk: a zstd-chunked lead field's own storage
//              chunk, else the request's, else about 4 MiB of the lead field
//   readers    the request's; else, with dsbench results (bench), the thread
//   prefetch   count of the best cold random reads and the slots that cover a
//              p99 read (tuning.hpp); else 2 readers, 4 slots
//   direct     the request's; else O_DIRECT for the bulk fields exactly where
//              the split does not fit in the memory available beside the
//              stream (the page cache cannot hold it, and buffered reads under
//              reclaim fall short of the disk)
//   host       the stream's ring, window cache and reader buffers
//              (plan_host_memory): the host ceiling
//   device     the backend memory the source will hold (planned_device_bytes)
//
// and says why, in lines every caller prints the same way (describe). A plan
// is per (dataset, split): training and evaluation are two plans
// (plan_training), and a mix of datasets a plan per member.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dstk/data/batch_source.hpp"
#include "dstk/data/settings.hpp"

namespace dstk::data {

struct SourceRequest {
    std::string split = "train";
    // The split's fields each batch holds, in this order; empty: the input and
    // label roles (the trainer's pair).
    std::vector<std::string> fields;
    Placement placement = Placement::automatic;
    Device device;
    Order order = Order::chunk;
    std::uint64_t seed = 0;
    std::uint64_t window = 8;        // chunk order: chunks mixed together
    std::uint64_t chunk_samples = 0; // chunk order: samples per chunk (0: automatic)
    std::uint32_t batch = 256;
    bool rows = false; // SourceConfig::rows
    RankSlice slice;
    bool drop_last = true;
    std::optional<unsigned> prefetch, readers; // unset: from bench, else 4 slots and 2 readers
    std::optional<bool> direct;                // unset: automatic (see above)
    std::uint64_t host_mem = 0;                // stream: host memory for ring + cache + buffers; 0: automatic
    ManagedPolicy managed_policy = ManagedPolicy::prefetch;
    bool oversubscribe = false;
    std::filesystem::path bench; // dsbench results (--json): readers and prefetch from its figures
    // Backend memory the caller needs beside the data (its model): auto
    // placement leaves it free.
    std::uint64_t reserved_device_bytes = 0;

    // What the source is built with (not decisions of the plan).
    void* compute_stream = nullptr; // cuda: batches are ordered before work on it
    bool hash_batches = false;      // cpu: StageTimes::batch_hash
    Message notice, warn;           // O_DIRECT refused at open, mid-run
    SettingNames names;             // how messages spell the settings
};

// The machine as the plan sees it. machine_facts() reads this machine;
// tests give their own.
struct MachineFacts {
    std::uint64_t host_available = 0;      // available_host_memory()
    std::optional<std::uint64_t> gpu_free; // the device's free memory (cuda)
    std::string gpu_missing;               // cuda: why the device does not answer (gpu_free unset)
    unsigned hardware_threads = 1;
};
MachineFacts machine_facts(const Device& device);

// cuda:0 where this build has CUDA and a GPU answers, else cpu; `why` (when
// given) says why there is no GPU.
Device default_device(std::string* why = nullptr);

struct SourcePlan {
    std::filesystem::path dataset;
    std::string split;
    std::vector<BatchField> fields; // delivered, in batch order: names, stored dtypes, shapes (no data)
    std::string lead_field;         // the most bytes per sample (source_fields.hpp)
    std::uint64_t samples = 0;      // of the split
    std::uint64_t sample_bytes = 0; // of one sample over every delivered field
    std::uint64_t split_bytes = 0;  // samples x sample_bytes
    std::uint64_t batches = 0;      // per epoch
    SourceConfig config;            // what make_batch_source builds
    HostPlan host;                  // stream placement: its host memory; resident: staging or the split
    std::uint64_t host_bytes = 0;   // the host ceiling of the data path
    std::uint64_t device_bytes = 0; // backend memory the source holds
    // Why, for the user: the placement (auto: the bytes against the room),
    // O_DIRECT (automatic: the split against the memory beside the stream),
    // readers and prefetch (bench's figures), and warnings (the full order
    // on a split larger than memory).
    std::string placement_why, direct_why;
    std::vector<std::string> tuning, notes, warnings;
};

// Usage errors name the settings (request.names spells them): a bad batch,
// prefetch or readers, fields the split lacks, a batch larger than the split,
// managed memory without a GPU. No-fit errors (exit 3): a host_mem below what
// the stream needs, managed memory larger than the GPU without oversubscribe.
SourcePlan plan_source(const Dataset& ds, const SourceRequest& request, const MachineFacts& machine);

// dstrain's two sources: training on request.split and, where the dataset has
// a non-empty `eval_split`, evaluation on it (sequential, every sample, the
// least window cache, the whole split on every rank). One placement for both
// (auto: both splits against the room); request.host_mem, when given, caps
// the two together.
struct TrainingPlan {
    SourcePlan train;
    std::optional<SourcePlan> eval;
};
TrainingPlan plan_training(const Dataset& ds, const SourceRequest& request, std::string_view eval_split,
                           const MachineFacts& machine);

// The source the plan describes, over `ds` (the dataset it was planned on).
std::unique_ptr<BatchSource> make_batch_source(const Dataset& ds, const SourcePlan& plan);

// The plan in words, one line each, the same from every caller:
//   "stream (why), order chunk (1,365 samples x 8 chunks per window), batch 256"
//   "fields x u8[3x32x32], y i32; readers 2, prefetch 4, O_DIRECT off (why)"
//   "host 131.0 MiB (ring 3.0 MiB + window cache 128.0 MiB + buffers 0 B), device 3.0 MiB"
std::vector<std::string> describe(const SourcePlan& plan);
// The plan as JSON (dsplan --json, dsbench's results, the Python loader).
nlohmann::json plan_json(const SourcePlan& plan);

} // namespace dstk::data
