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

// One field of a sample.
struct FieldSpec {
    std::string name;
    Shape shape; // per sample; empty: a scalar
    DType dtype = DType::f32;
    std::uint64_t bytes() const { return sample_bytes(shape, dtype); }
};
// "NAME:SHAPE:DTYPE" (--field): "robs:120:f32", "stim:1x36x36:u8"; a scalar
// has an empty SHAPE ("moves::i32"). Usage error naming --field otherwise.
FieldSpec parse_field_spec(std::string_view text);

// The data: the fields of a sample, the samples, and where they are stored.
struct DataSpec {
    std::vector<FieldSpec> fields;
    // The fields with the input and label roles (indices in fields). The
    // capacity rows vary the input's dtype; without one they size the
    // fields as they are.
    std::optional<std::size_t> input, label;
    std::uint64_t train = 0, test = 0; // samples; train == 0 and test == 0: capacity only
    // Bytes on disk where they are known and differ from the npy layout
    // (existing datasets: the sum of their files, compressed or not).
    std::optional<std::uint64_t> stored_bytes;
    bool on_disk = false;    // existing datasets: they already have their disk space
    bool compressed = false; // zstd-chunked fields: an epoch from disk decodes what it reads

    bool has_samples() const { return train + test > 0; }
    const FieldSpec* input_field() const { return input ? &fields.at(*input) : nullptr; }
};
// The classic sample: an input field "x" and, unless `label` is nullopt, a
// scalar label field "y" (what --shape, --dtype and --label-dtype describe).
DataSpec input_and_label(const Shape& shape, DType dtype, std::optional<DType> label);

// The data with the input field stored as `t` (nullopt, or no input field: as it is).
DataSpec with_dtype(const DataSpec& d, std::optional<DType> t);
std::uint64_t input_bytes_per_sample(const DataSpec& d); // 0 without an input field
std::uint64_t label_bytes_per_sample(const DataSpec& d); // 0 without a label field
std::uint64_t bytes_per_sample(const DataSpec& d);       // every field
std::uint64_t widest_field_bytes(const DataSpec& d);     // per sample: what sets the chunk size
std::uint64_t total_samples(const DataSpec& d);          // train + test, checked
// Bytes in memory (RAM or GPU), decoded: samples x bytes_per_sample.
std::uint64_t dataset_bytes(const DataSpec& d);
std::uint64_t input_bytes(const DataSpec& d); // samples x input bytes per sample
// Bytes on disk: stored_bytes, or the npy layout (data plus one .npy header
// per field per split, as dsgen and dsconvert write it).
std::uint64_t disk_bytes(const DataSpec& d);
// The npy headers of that layout, for n samples split as train/test.
std::uint64_t npy_overhead(const DataSpec& d);

// Several datasets sized as one (dsplan --dataset A --dataset B): the same
// fields, samples and stored bytes added up. Usage error naming the first
// difference in fields, dtypes or shapes.
struct NamedData {
    std::string name; // the dataset's directory
    DataSpec data;
};
DataSpec combine_data(const std::vector<NamedData>& members);

// The training job, for the GPU footprint.
struct Job {
    std::uint32_t batch = 256;
    std::uint32_t prefetch = 4; // ring slots (K): batches in flight between disk/RAM and the GPU
    // Model, optimiser, activations and workspace on the GPU, where dstrain's
    // memory plan is available; nullopt: not included in the footprint.
    std::optional<std::uint64_t> model_bytes;
};

// K batch slots of every field: the device ring in stream placement (the
// pinned host ring is the same size, in RAM).
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

// What fits, for one dtype of the input field (nullopt: the fields as they
// are, for data without an input field).
struct Capacity {
    std::optional<DType> dtype;
    std::uint64_t bytes_per_sample = 0;
    std::optional<std::uint64_t> ram_samples, disk_samples, gpu_samples; // most samples in each budget
    std::optional<std::uint64_t> dataset_bytes;                          // when the data has samples
    std::optional<Fit> fit;                                              // when the data has samples
};
// The input field's dtype first, then u8, bf16 (f16 is the same size) and
// f32; without an input field, one row of the fields as they are.
std::vector<Capacity> capacity_by_dtype(const DataSpec& d, const Job& j, const Budgets& b);
// Most samples n with n x per_sample + fixed <= budget (0 when fixed > budget).
std::uint64_t max_samples(std::uint64_t budget, std::uint64_t per_sample, std::uint64_t fixed = 0);

// The seeds' "Quick Reference": RAM sizes 16G to 1T as rows.
struct TableRow {
    std::uint64_t ram = 0, usable = 0;
    std::vector<std::uint64_t> max_samples; // one per dtype column
};
std::vector<std::uint64_t> table_ram_sizes(); // 16, 32, 64, 128, 256, 512 GiB, 1 TiB
// One column per input dtype (nullopt: the fields as they are).
std::vector<TableRow> quick_reference(const DataSpec& d, const Job& j, std::span<const std::optional<DType>> columns,
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
// From an estimate's stage terms: the epoch (the slowest known term; ties go
// to compute), the stage that limits it, io_bound and the recommended
// prefetch. estimate_epoch ends with it; a mix's estimate sums its members'
// terms first.
void settle_epoch(EpochEstimate& e);
inline constexpr std::uint64_t min_chunk_bytes = std::uint64_t{4} << 20;

// The options of the dsplan command line, as typed; run_plan validates them.
struct PlanOptions {
    std::string ram, disk, gpu_mem;    // empty: detect
    std::string dir;                   // where the dataset lives (free disk); default: the first --dataset, or "."
    std::vector<std::string> datasets; // existing dataset directories (sized together)
    std::vector<std::string> fields;   // NAME:SHAPE:DTYPE (--field)
    std::string shape, dtype, label_dtype = "i32", samples, test = "0";
    std::uint32_t batch = 256, prefetch = 4;
    std::string model;                    // a dstrain model name or spec (validated against the shape)
    std::optional<std::uint32_t> classes; // --classes; unset: the manifest's, else 10
    std::string compute_rate;             // samples/s
    std::string order = "chunk";
    std::string data = "auto"; // the placement the epoch is estimated for: auto, device or stream
    std::string os_reserve = "10G", headroom = "20%";
    std::string bench;           // dsbench --json output
    std::vector<double> weights; // several --dataset: the mix's weights, one per dataset (default: their sizes)
    bool table = false, check = false;
    std::string require; // with --check: the worst placement that passes (default disk)
    OutputOptions out;
};

// Prints the plan (text or --json); throws Error(no_fit) when --check fails.
void run_plan(const PlanOptions& o);

} // namespace dstk::plan
