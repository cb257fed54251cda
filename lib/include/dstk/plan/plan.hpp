#pragma once
// dsplan: size a dataset against a machine and say where it should live.
//
// The sizing model is a set of pure functions of (data, machine, assumptions,
// job): no detection, no I/O, exact integer arithmetic. run_plan() gathers the
// inputs (detection, options, a manifest, dsbench results), calls the model
// and prints the result. Every formula is documented in man/dsplan.1.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/data/stage.hpp"
#include "dstk/dtype.hpp"
#include "dstk/output.hpp"
#include "dstk/shape.hpp"

namespace dstk::plan {

// Where a figure about the machine came from: the output says it for each.
enum class Source : std::uint8_t { detected, given, unknown };
std::string_view source_name(Source s);

struct Figure {
    std::uint64_t bytes = 0;
    Source source = Source::unknown;
    bool known() const { return source != Source::unknown; }
};

struct Machine {
    Figure ram;           // total RAM the plan may use (MemTotal, capped by a cgroup limit), or --ram
    Figure ram_available; // MemAvailable when detected (reported, not used by the model)
    unsigned numa_nodes = 1;
    Figure disk; // free bytes where the dataset lives (--dir), or --disk
    std::string disk_path, filesystem;
    Figure gpu;           // free GPU memory when detected, or --gpu-mem
    std::string gpu_name; // empty where there is none
    int pcie_generation = 0, pcie_width = 0;
    std::vector<std::string> notes; // what detection could not see, and why
};

struct Assumptions {
    std::uint64_t os_reserve = std::uint64_t{10} << 30; // RAM kept for the OS and the tools
    std::uint32_t headroom_ppm = 200'000;               // share of each budget kept free, parts per million
};

// "20%" or "20" (percent, 0 <= p < 100, fractions allowed: "12.5%") to parts per million.
std::uint32_t parse_headroom(std::string_view text);
std::string format_headroom(std::uint32_t ppm); // "20%", "12.5%"

// What a budget leaves: (capacity - reserve) minus headroom, rounding the
// headroom up; 0 when the reserve takes everything.
std::uint64_t usable_bytes(std::uint64_t capacity, std::uint64_t reserve, std::uint32_t headroom_ppm);
// The capacity whose usable_bytes is at least `need` (inverse of the above).
std::uint64_t capacity_needed(std::uint64_t need, std::uint64_t reserve, std::uint32_t headroom_ppm);

struct Budgets {
    Figure ram, disk, gpu; // usable bytes; unknown where the machine figure is
    Assumptions assumptions;
    std::uint64_t disk_free = 0; // the machine's free disk, for "X more disk" fixes
};
// RAM: (ram - os_reserve) x (1 - headroom); disk and GPU: figure x (1 - headroom).
Budgets compute_budgets(const Machine& m, const Assumptions& a);

// The data: one input field and, optionally, a label per sample.
struct DataSpec {
    Shape shape;
    DType dtype = DType::f32;
    std::optional<DType> label_dtype = DType::i32; // nullopt: no labels
    std::uint64_t train = 0, test = 0;             // samples; train == 0 and test == 0: capacity only
    // Bytes on disk where they are known and differ from the npy layout
    // (an existing dataset: the sum of its files, compressed or not).
    std::optional<std::uint64_t> stored_bytes;
    bool on_disk = false;    // an existing dataset: it already has its disk space
    bool compressed = false; // zstd-chunked input: an epoch from disk decodes what it reads

    bool has_samples() const { return train + test > 0; }
};

std::uint64_t input_bytes_per_sample(const DataSpec& d);
std::uint64_t label_bytes_per_sample(const DataSpec& d); // 0 without labels
std::uint64_t bytes_per_sample(const DataSpec& d);       // input + label
std::uint64_t total_samples(const DataSpec& d);          // train + test, checked
// Bytes in memory (RAM or GPU), decoded: samples x bytes_per_sample.
std::uint64_t dataset_bytes(const DataSpec& d);
std::uint64_t input_bytes(const DataSpec& d); // samples x input bytes per sample
// Bytes on disk: stored_bytes, or the npy layout (data plus one .npy header
// per field per split, as dsgen writes it).
std::uint64_t disk_bytes(const DataSpec& d);
// The npy headers of that layout, for n samples split as train/test.
std::uint64_t npy_overhead(const DataSpec& d);

// The training job, for the GPU footprint.
struct Job {
    std::uint32_t batch = 256;
    std::uint32_t prefetch = 4; // ring slots (K): batches in flight between disk/RAM and the GPU
    // Model, optimiser, activations and workspace on the GPU, where dstrain's
    // memory plan is available; nullopt: not included in the footprint.
    std::optional<std::uint64_t> model_bytes;
};

// K batch slots of input and labels: the device ring in stream placement
// (the pinned host ring is the same size, in RAM).
std::uint64_t ring_bytes(const DataSpec& d, const Job& j);

// Which budget the data fits: GPU memory (device), RAM, disk, or none of them.
// Not data::Placement, which is where dstrain keeps the data while it trains.
enum class Fit : std::uint8_t { device, ram, disk, none };
std::string_view fit_name(Fit f);
Fit parse_fit(std::string_view text); // usage error otherwise
// device is the best, none the worst.
inline bool at_least(Fit got, Fit wanted) {
    return static_cast<int>(got) <= static_cast<int>(wanted);
}

struct Verdict {
    Fit fit = Fit::none;
    std::uint64_t gpu_device = 0;     // GPU bytes with the data resident: dataset + model
    std::uint64_t gpu_stream = 0;     // GPU bytes when streaming: model + ring
    std::uint64_t ram = 0;            // RAM bytes to hold the data: dataset + pinned ring
    std::uint64_t disk = 0;           // disk bytes (0 for a dataset already on disk)
    bool gpu_checked = false;         // false when the GPU memory is unknown
    std::vector<std::string> reasons; // why each better placement was ruled out, in order
    std::vector<std::string> fixes;   // for none: the cheapest first
};

// device when the data plus the model fit the GPU budget; ram when the data
// (and the pinned ring) fit the RAM budget; disk when it fits on disk; none
// otherwise, or when even the streaming footprint does not fit the GPU.
Verdict plan_placement(const DataSpec& d, const Job& j, const Budgets& b);
// Fixes list compression before "fewer samples" only up to this ratio.
inline constexpr double plausible_zstd_ratio = 2.0;

// What fits, for one dtype of the input field.
struct Capacity {
    DType dtype = DType::f32;
    std::uint64_t bytes_per_sample = 0;
    std::optional<std::uint64_t> ram_samples, disk_samples, gpu_samples; // most samples in each budget
    std::optional<std::uint64_t> dataset_bytes;                          // when the data has samples
    std::optional<Fit> fit;                                              // when the data has samples
};
// The input field's dtype first, then u8, bf16 (f16 is the same size) and f32.
std::vector<Capacity> capacity_by_dtype(const DataSpec& d, const Job& j, const Budgets& b);
// Most samples n with n x per_sample + fixed <= budget (0 when fixed > budget).
std::uint64_t max_samples(std::uint64_t budget, std::uint64_t per_sample, std::uint64_t fixed = 0);

// The seeds' "Quick Reference": RAM sizes 16G to 1T as rows.
struct TableRow {
    std::uint64_t ram = 0, usable = 0;
    std::vector<std::uint64_t> max_samples; // one per dtype column
};
std::vector<std::uint64_t> table_ram_sizes(); // 16, 32, 64, 128, 256, 512 GiB, 1 TiB
std::vector<TableRow> quick_reference(const DataSpec& d, const Job& j, std::span<const DType> columns,
                                      const Assumptions& a);

// Measured rates, from dsbench's JSON (bytes per second; nullopt where not measured).
struct Rates {
    // random_read: single samples (the full order); chunk_read: whole chunks at
    // random offsets, what dstrain's stream window cache issues in the chunk
    // and sequential orders (seq_read where no chunk figure is known), at
    // chunk_threads reads in flight; decode: zstd decompression (decoded bytes)
    // on decode_threads threads.
    std::optional<double> seq_read, random_read, chunk_read, h2d_pinned, decode;
    unsigned chunk_threads = 0, decode_threads = 0;
    std::string source; // the file they came from
};

struct EpochEstimate {
    std::uint64_t read_bytes = 0;         // bytes read from disk per epoch (disk placement)
    std::uint64_t transfer_bytes = 0;     // bytes copied to the GPU per epoch (ram and disk placements)
    std::optional<double> read_seconds;   // read_bytes / read rate
    std::optional<double> decode_seconds; // zstd-chunked input read from disk: decoded bytes / decode rate
    std::optional<double> transfer_seconds;
    std::optional<double> compute_seconds; // train samples / compute rate
    std::optional<double> epoch_seconds;   // the largest of the known terms
    std::optional<data::Stage> limited_by; // the stage of that term
    bool io_bound = false;                 // a data term is larger than compute
    std::optional<std::uint32_t> prefetch; // recommended ring depth K
    std::uint64_t chunk_samples = 0;       // recommended samples per chunk (zstd-chunked storage)
};
// The stages run concurrently (readers, decoders, copies and the GPU overlap
// through the window cache and the ring), so the epoch takes the slowest.
// p: where the batches come from (device: GPU memory, compute only; ram: host
// memory, plus the copy; disk: the disk read, the decode of compressed input
// and the copy, as a stream epoch from a cold page cache). compute_rate:
// training samples per second (0: unknown). random_order: the "full" shuffle,
// read at the random read rate.
EpochEstimate estimate_epoch(const DataSpec& d, const Job& j, Fit p, const Rates& r, double compute_rate,
                             bool random_order);
inline constexpr std::uint64_t min_chunk_bytes = std::uint64_t{4} << 20;

// The options of the dsplan command line, as typed; run_plan validates them.
struct PlanOptions {
    std::string ram, disk, gpu_mem; // empty: detect
    std::string dir;                // where the dataset lives (free disk); default: --dataset or "."
    std::string dataset;            // an existing dataset directory
    std::string shape, dtype, label_dtype = "i32", samples, test = "0";
    std::uint32_t batch = 256, prefetch = 4;
    std::string model;                    // a dstrain model name or spec (validated against the shape)
    std::optional<std::uint32_t> classes; // --classes; unset: the manifest's, else 10
    std::string compute_rate;             // samples/s
    std::string order = "chunk";
    std::string data = "auto"; // the placement the epoch is estimated for: auto, device or stream
    std::string os_reserve = "10G", headroom = "20%";
    std::string bench; // dsbench --json output
    bool table = false, check = false;
    std::string require; // with --check: the worst placement that passes (default disk)
    OutputOptions out;
};

// Prints the plan (text or --json); throws Error(no_fit) when --check fails.
void run_plan(const PlanOptions& o);

} // namespace dstk::plan
