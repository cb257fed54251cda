// dsplan's inputs and outputs: options and detection into the sizing model
// (plan.cpp), and the result as a readable report or one JSON document.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dstk/bench/results.hpp"
#include "dstk/data/batch_source.hpp"
#include "dstk/data/order.hpp"
#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/output.hpp"
#include "dstk/plan/plan.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/train/model.hpp"
#include "dstk/train/trainer.hpp"
#include "dstk/units.hpp"
#include "plan/data_path.hpp"
#include "plan/mix_report.hpp"

namespace dstk::plan {
namespace {

// The model's training footprint from dstrain's own memory plan, the CPU
// backend's, computed without building a trainer (weights, gradients,
// optimiser slots, activations kept for the backward pass at this batch: a
// trainer would allocate them, gigabytes at a large --batch), plus the cuDNN workspace bound twice: the
// GPU backend allocates at most that for its data gradients and again for the
// weight gradients beside them. The GPU backend's own plan differs from it by a
// few percent (dsplan and dstrain each print theirs).
std::uint64_t model_footprint(const train::NetworkPlan& net, DType dtype, std::uint32_t batch) {
    train::TrainerConfig tc;
    tc.plan = net;
    tc.input_dtype = dtype;
    tc.max_batch = batch;
    tc.mean.assign(net.input.c, 0.0f);
    tc.std.assign(net.input.c, 1.0f);
    tc.precision = train::Precision::fp32;
    tc.device = train::Device{train::Backend::cpu, 0};
    const train::MemoryPlan p = train::cpu_memory_plan(tc);
    return p.parameters + p.activations + 2 * tc.workspace_limit;
}

using nlohmann::json;

using data::Order;

struct ModelInfo {
    std::string name;
    std::uint64_t parameters = 0;
    std::uint32_t classes = 0;
    std::uint64_t training_flops = 0; // per trained sample, in the matrix products (NetworkPlan::training_flops)
};

// Everything the report shows, gathered once.
struct Inputs {
    Machine machine;
    Assumptions assumptions;
    bool os_reserve_given = false, headroom_given = false;
    DataSpec data;
    std::vector<NamedData> datasets; // --dataset, each (data is their sum)
    Job job;
    std::optional<ModelInfo> model;
    std::optional<std::uint32_t> manifest_classes;
    double compute_rate = 0;
    Order order = Order::chunk;
    data::Placement placement = data::Placement::automatic; // --data: what the epoch is estimated for
    std::uint64_t storage_chunk = 0;                        // zstd-chunked input: samples per chunk
    Rates rates;
    bool table = false, table_default_shape = false;
    std::optional<Fit> require; // set with --check
};

std::uint64_t positive_size(const std::string& text, const char* what) {
    const std::uint64_t v = parse_memory_size(text, what);
    if (v == 0) throw usage_error("invalid " + std::string(what) + " '" + text + "' (must be more than 0 bytes)");
    return v;
}

void detect_machine(const PlanOptions& o, const std::string& dir, Machine& m) {
    const SystemInfo sys = detect_system();
    m.numa_nodes = sys.numa_nodes;
    if (!sys.hwloc_ok) m.notes.push_back("hwloc could not load the topology: NUMA nodes unknown, assuming 1");
    if (sys.memory.available > 0) m.ram_available = {sys.memory.available, Source::detected};
    if (!o.ram.empty()) {
        m.ram = {positive_size(o.ram, "--ram"), Source::given};
    } else if (sys.memory.total == 0) {
        m.notes.push_back("could not read MemTotal from /proc/meminfo: RAM unknown (give --ram)");
    } else {
        std::uint64_t ram = sys.memory.total;
        // /proc/meminfo is the kernel's current figure (it follows a VM's memory
        // hotplug); hwloc's NUMA sums can be stale or wrong in sandboxes.
        if (sys.memory.sources_disagree())
            m.notes.push_back("/proc/meminfo says " + format_bytes(sys.memory.total) + " and hwloc " +
                              format_bytes(*sys.memory.hwloc_total) +
                              " (a VM whose memory changed while running, or a sandbox?): using /proc/meminfo; "
                              "give --ram to choose");
        if (sys.cgroup_memory_limit && *sys.cgroup_memory_limit < ram) {
            m.notes.push_back("a cgroup memory limit of " + format_bytes(*sys.cgroup_memory_limit) +
                              " applies: planning with it instead of " + format_bytes(ram));
            ram = *sys.cgroup_memory_limit;
        }
        m.ram = {ram, Source::detected};
    }

    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(dir, ec);
    m.disk_path = ec ? dir : abs.lexically_normal().string();
    while (m.disk_path.size() > 1 && m.disk_path.back() == '/') m.disk_path.pop_back();
    if (!o.disk.empty()) {
        m.disk = {positive_size(o.disk, "--disk"), Source::given};
    } else {
        const DiskInfo d = disk_info(dir);
        if (d.total == 0)
            m.notes.push_back("could not read the free space at '" + dir + "': disk unknown (give --disk)");
        else
            m.disk = {d.free, Source::detected};
        m.filesystem = d.filesystem;
    }

    std::string why;
    const std::vector<GpuInfo> gpus = detect_gpus(&why);
    if (!gpus.empty()) {
        const GpuInfo& g = gpus.front();
        m.gpu_name = g.name;
        m.pcie_generation = g.pcie_generation;
        m.pcie_width = g.pcie_width;
        if (gpus.size() > 1)
            m.notes.push_back(std::to_string(gpus.size()) + " GPUs: planning for GPU 0 (" + g.name + ")");
        if (o.gpu_mem.empty()) m.gpu = {g.free_memory, Source::detected};
    } else if (o.gpu_mem.empty()) {
        m.notes.push_back("no GPU (" + why + "): GPU placement not checked; give --gpu-mem 8G to plan for one");
    }
    if (!o.gpu_mem.empty()) m.gpu = {positive_size(o.gpu_mem, "--gpu-mem"), Source::given};
}

// One existing dataset: its fields (the train split's), samples (train, and
// every other split as test) and its files' bytes, exactly.
NamedData describe_one_dataset(const std::string& dir, Inputs& in) {
    const Dataset ds = Dataset::open(dir); // validates the manifest against the files: exit 1
    const Manifest& m = ds.manifest();
    const SplitInfo* train = m.find("train");
    const SplitInfo& first = train ? *train : m.splits.at(0);
    NamedData nd{dir, {}};
    DataSpec& d = nd.data;
    for (const FieldInfo& f : first.fields) {
        if (f.name == m.input_field) d.input = d.fields.size();
        if (f.name == m.label_field) d.label = d.fields.size();
        d.fields.push_back({f.name, f.shape, f.dtype});
        d.compressed |= f.storage == Storage::zstd_chunked;
        if (f.storage == Storage::zstd_chunked && (f.name == m.input_field || !in.storage_chunk))
            in.storage_chunk = f.chunk_samples;
    }
    std::uint64_t stored = 0;
    for (const SplitInfo& s : m.splits) {
        (&s == train ? d.train : d.test) += s.samples;
        for (const FieldInfo& f : s.fields) stored = checked_add(stored, f.bytes, "dataset");
    }
    d.stored_bytes = stored;
    d.on_disk = true;
    if (m.num_classes && (!in.manifest_classes || *m.num_classes > *in.manifest_classes))
        in.manifest_classes = m.num_classes;
    return nd;
}

void describe_datasets(const PlanOptions& o, Inputs& in) {
    for (const auto& [value, name] : {std::pair{&o.shape, "--shape"}, std::pair{&o.samples, "--samples"}})
        if (!value->empty())
            throw usage_error(std::string(name) + " cannot be used with --dataset (it comes from the manifest)");
    if (o.test != "0" || o.label_dtype != "i32" || !o.fields.empty())
        throw usage_error("--test, --label-dtype and --field cannot be used with --dataset (they come from the "
                          "manifest)");
    for (const std::string& dir : o.datasets) in.datasets.push_back(describe_one_dataset(dir, in));
    in.data = combine_data(in.datasets);
    DataSpec& d = in.data;
    if (!o.dtype.empty()) {
        const DType t = parse_dtype(o.dtype, "--dtype");
        if (!d.input)
            throw usage_error("--dtype asks 'what if the input field were stored as " + o.dtype + "', and '" +
                              o.datasets.front() + "' names no input field; set it with dsconvert --input NAME");
        if (t != d.fields[*d.input].dtype) { // "what if it were stored as t": a converted copy, written at --dir
            d.fields[*d.input].dtype = t;
            d.stored_bytes.reset();
            d.on_disk = false;
            d.compressed = false;
            in.storage_chunk = 0;
        }
    }
}

// --shape (the input x, with --dtype, and a label y of --label-dtype) and
// --field NAME:SHAPE:DTYPE (more fields; without --shape the first is the
// input, and --dtype asks "what if it were stored as").
void describe_fields(const PlanOptions& o, Inputs& in) {
    DataSpec& d = in.data;
    if (o.shape.empty() && o.fields.empty()) {
        if (!o.samples.empty())
            throw usage_error("no data to plan (give --shape 3x32x32 [--dtype f32] --samples N, --field "
                              "NAME:SHAPE:DTYPE ... --samples N, or --dataset DIR)");
        if (!o.table)
            throw usage_error("nothing to plan: dsplan needs the data (--shape 3x32x32 [--dtype f32] [--samples "
                              "N], --field NAME:SHAPE:DTYPE ..., or --dataset DIR), or --table for the "
                              "quick-reference table; see dsplan --help");
        in.table_default_shape = true; // the seeds' table is for CIFAR-sized samples
    }
    const std::optional<DType> dtype =
        o.dtype.empty() ? std::nullopt : std::optional<DType>(parse_dtype(o.dtype, "--dtype"));
    if (!o.shape.empty() || o.fields.empty()) {
        const Shape shape = o.shape.empty() ? parse_shape("3x32x32") : parse_shape(o.shape, "--shape");
        const std::optional<DType> label =
            o.label_dtype == "none" ? std::nullopt : std::optional(parse_dtype(o.label_dtype, "--label-dtype"));
        d = input_and_label(shape, dtype.value_or(DType::f32), label);
    } else if (o.label_dtype != "i32") {
        throw usage_error("--label-dtype describes the label of --shape; give a label as --field NAME::DTYPE");
    }
    for (const std::string& text : o.fields) {
        FieldSpec f = parse_field_spec(text);
        for (const FieldSpec& g : d.fields)
            if (g.name == f.name)
                throw usage_error("--field " + text + ": a field named '" + f.name + "' is given already" +
                                  (o.shape.empty() ? "" : " (--shape describes x and y)"));
        d.fields.push_back(std::move(f));
    }
    if (!d.input) {
        d.input = 0;
        if (dtype) d.fields[0].dtype = *dtype;
    }
}

void describe_data(const PlanOptions& o, Inputs& in) {
    DataSpec& d = in.data;
    describe_fields(o, in);
    if (!o.samples.empty()) {
        d.train = parse_count(o.samples, "--samples");
        if (d.train == 0) throw usage_error("invalid --samples 0 (must be at least 1)");
    }
    d.test = parse_count(o.test, "--test");
    if (d.test > 0 && d.train == 0) throw usage_error("--test needs --samples (the training samples)");
}

// dsbench's figures for this job: chunk reads and zstd decoding at the thread
// count dstrain's window cache runs for this order and storage.
void read_rates(const std::string& file, Inputs& in) {
    const bench::Results r = bench::load_results(file);
    Rates& rates = in.rates;
    rates.source = file;
    rates.seq_read = bench::sequential_read_rate(r);
    rates.h2d_pinned = bench::pinned_h2d_rate(r);
    if (const auto rnd = bench::best_random_read(r, "sample")) rates.random_read = rnd->rate;
    data::OrderConfig order;
    order.kind = in.order;
    const unsigned threads = data::io_threads_for(order, 2, in.storage_chunk); // dstrain's 2 readers by default
    if (const auto ch = bench::rate_at_threads(r, "io.rand.chunk.pread.cold", threads)) {
        rates.chunk_read = ch->rate;
        rates.chunk_threads = ch->threads;
    }
    for (const char* key : {"decode.zstd.chunked", "decode.zstd"})
        if (const auto dec = bench::rate_at_threads(r, key, threads); dec && !rates.decode) {
            rates.decode = dec->rate;
            rates.decode_threads = dec->threads;
        }
}

// Where the estimated epoch takes its batches from: the verdict's budget with
// --data auto; --data stream reads every byte from disk (a cold page cache).
Fit epoch_path(const Inputs& in, Fit verdict) {
    if (verdict == Fit::none) return verdict;
    switch (in.placement) {
    case data::Placement::device:
        return Fit::device;
    case data::Placement::stream:
        return Fit::disk;
    default:
        return verdict;
    }
}

Inputs gather(const PlanOptions& o) {
    Inputs in;
    in.assumptions.os_reserve = parse_memory_size(o.os_reserve, "--os-reserve");
    in.assumptions.headroom_ppm = parse_headroom(o.headroom);
    in.os_reserve_given = o.os_reserve != PlanOptions{}.os_reserve;
    in.headroom_given = o.headroom != PlanOptions{}.headroom;
    if (o.batch == 0 || o.batch > (1u << 20))
        throw usage_error("invalid --batch " + std::to_string(o.batch) + " (must be 1 to 1048576)");
    if (o.prefetch == 0 || o.prefetch > 1024)
        throw usage_error("invalid --prefetch " + std::to_string(o.prefetch) + " (must be 1 to 1024)");
    in.job.batch = o.batch;
    in.job.prefetch = o.prefetch;
    in.order = data::parse_order(o.order);
    in.placement = data::parse_placement(o.data);
    if (in.placement == data::Placement::managed)
        throw usage_error("--data managed is not estimated by dsplan (its speed depends on page migration; "
                          "dsbench's loader.managed.* cases measure it); use --data auto, device or stream");
    if (!o.compute_rate.empty()) {
        const std::uint64_t r = parse_count(o.compute_rate, "--compute-rate");
        if (r == 0) throw usage_error("invalid --compute-rate 0 (samples per second must be positive)");
        in.compute_rate = static_cast<double>(r);
    }
    if (o.classes && *o.classes < 2)
        throw usage_error("invalid --classes " + std::to_string(*o.classes) +
                          " (a classifier needs at least 2 classes)");
    if (o.classes && o.model.empty())
        throw usage_error("--classes sizes the model's last layer; give it with --model NAME");
    in.table = o.table;
    if (!o.require.empty() || o.check) in.require = o.require.empty() ? Fit::disk : parse_fit(o.require);

    if (!o.datasets.empty())
        describe_datasets(o, in);
    else
        describe_data(o, in);
    (void)bytes_per_sample(in.data); // overflowing shapes fail here, as usage errors
    if (in.require && !in.data.has_samples())
        throw usage_error("--check needs a dataset to check (give --samples N, or --dataset DIR)");
    if (in.data.has_samples()) (void)disk_bytes(in.data);

    if (!o.model.empty()) {
        const FieldSpec* x = in.data.input_field();
        if (!x)
            throw usage_error("--model is planned against the input field, and the dataset names none; set it "
                              "with dsconvert --input NAME");
        const std::uint32_t classes = o.classes.value_or(in.manifest_classes.value_or(10));
        const train::ModelSpec spec = train::resolve_model(o.model, classes);
        const train::NetworkPlan net = train::plan_network(spec, train::tensor_shape_from(x->shape), classes);
        in.model = ModelInfo{spec.name, net.params, classes, net.training_flops()};
        in.job.model_bytes = model_footprint(net, x->dtype, in.job.batch);
    }

    const std::string dir = !o.dir.empty() ? o.dir : !o.datasets.empty() ? o.datasets.front() : ".";
    detect_machine(o, dir, in.machine);

    if (!o.bench.empty()) read_rates(o.bench, in);
    return in;
}

// ---- text output ----

std::string figure_text(const Figure& f) {
    return f.known() ? format_bytes(f.bytes) + " (" + std::string(source_name(f.source)) + ")" : "unknown";
}

std::string opt_count(const std::optional<std::uint64_t>& n) {
    return n ? format_count(*n) : "unknown";
}

std::string seconds_text(const std::optional<double>& s) {
    return s ? format_duration(*s) : "unknown";
}

void print_columns(const std::vector<std::vector<std::string>>& rows) {
    std::vector<std::size_t> width;
    for (const auto& r : rows)
        for (std::size_t i = 0; i < r.size(); ++i) {
            if (width.size() <= i) width.push_back(0);
            width[i] = std::max(width[i], r[i].size());
        }
    for (const auto& r : rows) {
        std::string line = " ";
        for (std::size_t i = 0; i < r.size(); ++i) {
            const bool right = i > 0; // figures right-aligned, labels left
            const std::string pad(width[i] - r[i].size(), ' ');
            line += "  " + (right ? pad + r[i] : r[i] + (i + 1 < r.size() ? pad : ""));
        }
        std::printf("%s\n", line.c_str());
    }
}

void print_machine(const Machine& m) {
    std::printf("machine\n");
    std::string ram = "  RAM         " + figure_text(m.ram);
    if (m.ram_available.known()) ram += ", " + format_bytes(m.ram_available.bytes) + " available now";
    ram += ", " + std::to_string(m.numa_nodes) + " NUMA node" + (m.numa_nodes == 1 ? "" : "s");
    std::printf("%s\n", ram.c_str());
    std::string disk = "  disk        " + (m.disk.known() ? format_bytes(m.disk.bytes) + " free (" +
                                                                std::string(source_name(m.disk.source)) + ")"
                                                          : std::string("unknown"));
    if (m.disk.source == Source::detected)
        disk += " at " + m.disk_path + (m.filesystem.empty() ? "" : " (" + m.filesystem + ")");
    std::printf("%s\n", disk.c_str());
    std::string gpu = "  GPU         ";
    if (m.gpu.known())
        gpu += format_bytes(m.gpu.bytes) + (m.gpu.source == Source::detected ? " free (detected)" : " (given)");
    else
        gpu += "none detected";
    if (!m.gpu_name.empty()) {
        gpu += ", " + m.gpu_name;
        if (m.pcie_generation > 0)
            gpu += ", PCIe Gen" + std::to_string(m.pcie_generation) + " x" + std::to_string(m.pcie_width);
    }
    std::printf("%s\n", gpu.c_str());
    for (const std::string& n : m.notes) std::printf("  note: %s\n", n.c_str());
}

// What the assumptions leave: no RAM at all is said, with the setting to change.
std::vector<std::string> budget_notes(const Inputs& in, const Budgets& b) {
    std::vector<std::string> notes;
    if (b.ram.known() && b.ram.bytes == 0)
        notes.push_back("the OS reserve of " + format_bytes(in.assumptions.os_reserve) + " (--os-reserve) leaves no " +
                        "RAM of the " + format_bytes(in.machine.ram.bytes) +
                        " for the data: every RAM figure below is 0; give a smaller --os-reserve (e.g. "
                        "--os-reserve 2G) if this machine keeps less for the OS and other processes");
    return notes;
}

void print_budgets(const Inputs& in, const Budgets& b) {
    const Machine& m = in.machine;
    std::printf("assumptions\n  OS reserve  %s (%s, --os-reserve)\n  headroom    %s of each budget (%s, --headroom)\n",
                format_bytes(in.assumptions.os_reserve).c_str(), in.os_reserve_given ? "given" : "default",
                format_headroom(in.assumptions.headroom_ppm).c_str(), in.headroom_given ? "given" : "default");
    const std::string keep = "(1 - " + format_headroom(in.assumptions.headroom_ppm) + ")";
    std::printf("budgets\n");
    std::printf("  RAM         %s\n", b.ram.known() ? (format_bytes(b.ram.bytes) + " = (" + format_bytes(m.ram.bytes) +
                                                       " - " + format_bytes(in.assumptions.os_reserve) + ") x " + keep)
                                                          .c_str()
                                                    : "unknown");
    std::printf("  disk        %s\n",
                b.disk.known()
                    ? (format_bytes(b.disk.bytes) + " = " + format_bytes(m.disk.bytes) + " x " + keep).c_str()
                    : "unknown");
    std::printf("  GPU         %s\n",
                b.gpu.known() ? (format_bytes(b.gpu.bytes) + " = " + format_bytes(m.gpu.bytes) + " x " + keep).c_str()
                              : "unknown (no GPU: placement device not considered)");
    for (const std::string& n : budget_notes(in, b)) std::printf("  note: %s\n", n.c_str());
}

// "x u8[3x32x32] 3,072 B + y i32 4 B = 3,076 B" (with_bytes), or "x u8[3x32x32] + y i32".
std::string sample_text(const DataSpec& d, bool with_bytes) {
    std::string out;
    for (const FieldSpec& f : d.fields) {
        if (!out.empty()) out += " + ";
        out += f.name + ' ' + field_type_text(f.dtype, f.shape);
        if (with_bytes) out += ' ' + format_count(f.bytes()) + " B";
    }
    if (with_bytes && d.fields.size() > 1) out += " = " + format_count(bytes_per_sample(d)) + " B";
    return out;
}

std::string role_text(const DataSpec& d, const std::optional<std::size_t>& role) {
    return role ? d.fields.at(*role).name : std::string("none");
}

void print_data(const Inputs& in) {
    const DataSpec& d = in.data;
    std::printf("data\n");
    for (const NamedData& m : in.datasets)
        std::printf("  dataset     %s: %s train + %s test, %s on disk, %s in memory\n", m.name.c_str(),
                    format_count(m.data.train).c_str(), format_count(m.data.test).c_str(),
                    format_bytes(disk_bytes(m.data)).c_str(), format_bytes(dataset_bytes(m.data)).c_str());
    if (in.table_default_shape) std::printf("  note: no --shape given: sizing 3x32x32 samples\n");
    std::printf("  sample      %s\n", sample_text(d, true).c_str());
    std::printf("  roles       input %s, label %s\n", role_text(d, d.input).c_str(), role_text(d, d.label).c_str());
    if (d.has_samples()) {
        const std::string all = in.datasets.size() > 1 ? " (" + std::to_string(in.datasets.size()) + " datasets)" : "";
        std::printf("  samples     %s train + %s test = %s%s\n", format_count(d.train).c_str(),
                    format_count(d.test).c_str(), format_count(total_samples(d)).c_str(), all.c_str());
        const std::string inputs = d.input ? "; inputs " + format_bytes(input_bytes(d)) : "";
        std::printf("  in memory   %s (%s bytes%s)\n", format_bytes(dataset_bytes(d)).c_str(),
                    format_count(dataset_bytes(d)).c_str(), inputs.c_str());
        std::printf("  on disk     %s%s\n", format_bytes(disk_bytes(d)).c_str(),
                    d.on_disk        ? " (already there)"
                    : d.stored_bytes ? ""
                                     : " (npy files as dsgen and dsconvert write them)");
    }
}

// The matrix products' rate at --compute-rate, e.g. "12.4 TFLOP/s".
std::string tflops_text(const Inputs& in) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f TFLOP/s",
                  in.compute_rate * static_cast<double>(in.model->training_flops) / 1e12);
    return buf;
}

void print_job(const Inputs& in) {
    const DataSpec& d = in.data;
    std::printf("job\n  batch %u, %u ring slots: %s per ring (on the GPU when streaming, and pinned in RAM)\n",
                in.job.batch, in.job.prefetch, format_bytes(ring_bytes(d, in.job)).c_str());
    if (in.model)
        std::printf("  model       %s: %s parameters, %u classes, %.1f MFLOP per trained sample in its matrix "
                    "products\n",
                    in.model->name.c_str(), format_count(in.model->parameters).c_str(), in.model->classes,
                    static_cast<double>(in.model->training_flops) / 1e6);
    if (in.job.model_bytes)
        std::printf("  training footprint %s (dstrain's memory plan: weights, gradients, optimiser state,\n"
                    "                     activations at batch %u, plus the %s cuDNN workspace bound twice)\n",
                    format_bytes(*in.job.model_bytes).c_str(), in.job.batch,
                    format_bytes(train::TrainerConfig{}.workspace_limit).c_str());
    else
        std::printf("  note: no --model: the GPU figures cover the data only (add --model ref-cnn for the\n"
                    "        training footprint)\n");
}

void print_capacity(const DataSpec& d, const std::vector<Capacity>& caps) {
    std::printf("capacity (most samples, train + test, that fit each budget)\n");
    std::vector<std::vector<std::string>> rows{{"dtype", "bytes/sample", "RAM", "disk", "GPU"}};
    if (d.has_samples()) {
        rows[0].push_back("this dataset");
        rows[0].push_back("placement");
    }
    for (const Capacity& c : caps) {
        rows.push_back({c.dtype ? std::string(dtype_name(*c.dtype)) : "as stored",
                        format_count(c.bytes_per_sample) + " B", opt_count(c.ram_samples), opt_count(c.disk_samples),
                        opt_count(c.gpu_samples)});
        if (c.dataset_bytes) {
            rows.back().push_back(format_bytes(*c.dataset_bytes));
            rows.back().push_back(std::string(fit_name(*c.fit)));
        }
    }
    print_columns(rows);
}

void print_verdict(const std::optional<Verdict>& v) {
    if (v) {
        static const char* what[] = {"the whole dataset in GPU memory", "in RAM: stream from RAM or managed memory",
                                     "stream from disk", "does not fit"};
        std::printf("verdict: %s (%s)\n", std::string(fit_name(v->fit)).c_str(), what[static_cast<int>(v->fit)]);
        for (const std::string& r : v->reasons) std::printf("  %s\n", r.c_str());
        if (!v->fixes.empty()) {
            std::printf("  fixes, cheapest first:\n");
            for (const std::string& f : v->fixes) std::printf("    - %s\n", f.c_str());
        }
    }
}

std::string threads_text(unsigned threads) {
    return threads ? " at " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") : "";
}

void print_epoch(const Inputs& in, Fit path, const std::optional<EpochEstimate>& e) {
    const DataSpec& d = in.data;
    if (e && path != Fit::none) {
        std::printf("epoch (%s train samples, order %s, %s)\n", format_count(d.train).c_str(),
                    std::string(data::order_name(in.order)).c_str(),
                    path == Fit::device ? "data in GPU memory"
                    : path == Fit::ram  ? "streamed from host memory"
                                        : "streamed from disk, cold page cache");
        const std::string src = in.rates.source.empty() ? "no --bench" : in.rates.source;
        if (path == Fit::disk) {
            const bool chunk = in.order != Order::full && in.rates.chunk_read;
            std::printf("  disk read   %s (%s at the %s read rate%s, %s)\n", seconds_text(e->read_seconds).c_str(),
                        format_bytes(e->read_bytes).c_str(),
                        in.order == Order::full ? "random sample"
                        : chunk                 ? "random chunk"
                                                : "sequential",
                        chunk ? threads_text(in.rates.chunk_threads).c_str() : "", src.c_str());
            if (d.compressed)
                std::printf("  decode      %s (zstd%s, %s)\n", seconds_text(e->decode_seconds).c_str(),
                            threads_text(in.rates.decode_threads).c_str(), src.c_str());
        }
        if (path != Fit::device)
            std::printf("  to the GPU  %s (%s at the pinned copy rate, %s)\n",
                        seconds_text(e->transfer_seconds).c_str(), format_bytes(e->transfer_bytes).c_str(),
                        src.c_str());
        const std::string rate = in.compute_rate <= 0 ? " (give --compute-rate, samples/s from a dstrain run)"
                                 : in.model           ? " (" + tflops_text(in) + " in the matrix products)"
                                                      : "";
        std::printf("  compute     %s%s\n", seconds_text(e->compute_seconds).c_str(), rate.c_str());
        if (e->epoch_seconds)
            std::printf("  epoch       %s at least, limited by %s%s\n", format_duration(*e->epoch_seconds).c_str(),
                        std::string(data::stage_name(*e->limited_by)).c_str(), e->io_bound ? ": I/O-bound" : "");
        else
            std::printf("  epoch       unknown (give --bench FILE from dsbench and --compute-rate)\n");
        if (path == Fit::disk && !e->read_seconds)
            std::printf("  I/O-bound?  unknown (run dsbench on this disk and give --bench FILE)\n");
        if (e->prefetch) std::printf("  recommended --prefetch %u\n", *e->prefetch);
        std::printf("  recommended chunk size %s samples (%s of the widest field, >= %s, whole batches)\n",
                    format_count(e->chunk_samples).c_str(),
                    format_bytes(e->chunk_samples * widest_field_bytes(d)).c_str(),
                    format_bytes(min_chunk_bytes).c_str());
    }
    if (in.order == Order::full && path == Fit::disk)
        warning("--order full reads one sample at a time at random from disk; --order chunk keeps the reads "
                "sequential");
}

void print_table(const Inputs& in, const std::vector<TableRow>& table,
                 const std::vector<std::optional<DType>>& table_types) {
    const DataSpec& d = in.data;
    if (in.table) {
        std::printf("quick reference (%s, %s per ring, OS reserve %s, headroom %s)\n", sample_text(d, false).c_str(),
                    format_bytes(ring_bytes(d, in.job)).c_str(), format_bytes(in.assumptions.os_reserve).c_str(),
                    format_headroom(in.assumptions.headroom_ppm).c_str());
        std::vector<std::vector<std::string>> t{{"RAM", "max dataset"}};
        for (const auto& ty : table_types) t[0].push_back(ty ? "samples " + std::string(dtype_name(*ty)) : "samples");
        for (const TableRow& r : table) {
            t.push_back({format_bytes(r.ram), format_bytes(r.usable)});
            for (const std::uint64_t n : r.max_samples) t.back().push_back(format_count(n));
        }
        print_columns(t);
    }
}

void print_text(const Inputs& in, const Budgets& b, const std::vector<Capacity>& caps, const std::optional<Verdict>& v,
                Fit path, const std::optional<EpochEstimate>& e, const std::vector<TableRow>& table,
                const std::vector<std::optional<DType>>& table_types) {
    print_machine(in.machine);
    print_budgets(in, b);
    print_data(in);
    print_job(in);
    print_capacity(in.data, caps);
    print_verdict(v);
    print_epoch(in, path, e);
    print_table(in, table, table_types);
}

// ---- JSON output ----

json figure_json(const Figure& f) {
    return {{"bytes", f.known() ? json(f.bytes) : json(nullptr)}, {"source", source_name(f.source)}};
}

template <class T> json opt(const std::optional<T>& v) {
    return v ? json(*v) : json(nullptr);
}

// "data": the fields, their roles, the datasets and the sizes.
json data_json(const Inputs& in) {
    const DataSpec& d = in.data;
    const FieldSpec* x = d.input_field();
    json fields = json::array();
    for (const FieldSpec& f : d.fields)
        fields.push_back({{"name", f.name},
                          {"shape", f.shape.str()},
                          {"dtype", dtype_name(f.dtype)},
                          {"bytes_per_sample", f.bytes()}});
    json datasets = json::array();
    for (const NamedData& m : in.datasets)
        datasets.push_back({{"dir", m.name},
                            {"train", m.data.train},
                            {"test", m.data.test},
                            {"disk_bytes", disk_bytes(m.data)},
                            {"dataset_bytes", dataset_bytes(m.data)}});
    json data = {{"fields", fields},
                 {"input_field", x ? json(x->name) : json(nullptr)},
                 {"label_field", d.label ? json(d.fields[*d.label].name) : json(nullptr)},
                 {"shape", x ? json(x->shape.str()) : json(nullptr)},
                 {"dtype", x ? json(dtype_name(x->dtype)) : json(nullptr)},
                 {"label_dtype", d.label ? json(dtype_name(d.fields[*d.label].dtype)) : json(nullptr)},
                 {"input_bytes_per_sample", input_bytes_per_sample(d)},
                 {"label_bytes_per_sample", label_bytes_per_sample(d)},
                 {"bytes_per_sample", bytes_per_sample(d)},
                 {"dataset", in.datasets.empty() ? json(nullptr) : json(in.datasets.front().name)},
                 {"datasets", datasets},
                 {"on_disk", d.on_disk}};
    if (d.has_samples()) {
        data["train"] = d.train;
        data["test"] = d.test;
        data["input_bytes"] = input_bytes(d);
        data["dataset_bytes"] = dataset_bytes(d);
        data["disk_bytes"] = disk_bytes(d);
    }
    return data;
}

json to_json(const Inputs& in, const Budgets& b, const std::vector<Capacity>& caps, const std::optional<Verdict>& v,
             Fit path, const std::optional<EpochEstimate>& e, const std::vector<TableRow>& table,
             const std::vector<std::optional<DType>>& table_types, std::optional<bool> check_passed) {
    const Machine& m = in.machine;
    const DataSpec& d = in.data;
    json doc;
    doc["tool"] = "dsplan";
    doc["version"] = DSTK_VERSION;
    doc["machine"] = {{"ram", figure_json(m.ram)},  {"ram_available", figure_json(m.ram_available)},
                      {"numa_nodes", m.numa_nodes}, {"disk", figure_json(m.disk)},
                      {"gpu", figure_json(m.gpu)},  {"notes", m.notes}};
    doc["machine"]["disk"]["path"] = m.disk_path;
    doc["machine"]["disk"]["filesystem"] = m.filesystem;
    doc["machine"]["gpu"]["name"] = m.gpu_name;
    doc["machine"]["gpu"]["pcie_generation"] = m.pcie_generation;
    doc["machine"]["gpu"]["pcie_width"] = m.pcie_width;
    doc["assumptions"] = {{"os_reserve_bytes", in.assumptions.os_reserve},
                          {"headroom_percent", in.assumptions.headroom_ppm / 10'000.0}};
    const auto budget = [](const Figure& f) { return f.known() ? json(f.bytes) : json(nullptr); };
    doc["budgets"] = {{"ram_bytes", budget(b.ram)},
                      {"disk_bytes", budget(b.disk)},
                      {"gpu_bytes", budget(b.gpu)},
                      {"notes", budget_notes(in, b)}};
    doc["data"] = data_json(in);
    doc["job"] = {{"batch", in.job.batch},
                  {"prefetch", in.job.prefetch},
                  {"ring_bytes", ring_bytes(d, in.job)},
                  {"order", data::order_name(in.order)},
                  {"model", in.model ? json(in.model->name) : json(nullptr)},
                  {"model_parameters", in.model ? json(in.model->parameters) : json(nullptr)},
                  {"model_training_flops_per_sample", in.model ? json(in.model->training_flops) : json(nullptr)},
                  {"model_footprint_included", in.job.model_bytes.has_value()},
                  {"model_footprint_bytes", in.job.model_bytes ? json(*in.job.model_bytes) : json(nullptr)}};
    json cj = json::array();
    for (const Capacity& c : caps) {
        cj.push_back({{"dtype", c.dtype ? json(dtype_name(*c.dtype)) : json(nullptr)},
                      {"bytes_per_sample", c.bytes_per_sample},
                      {"ram_samples", opt(c.ram_samples)},
                      {"disk_samples", opt(c.disk_samples)},
                      {"gpu_samples", opt(c.gpu_samples)},
                      {"dataset_bytes", opt(c.dataset_bytes)},
                      {"placement", c.fit ? json(fit_name(*c.fit)) : json(nullptr)}});
    }
    doc["capacity"] = cj;
    doc["verdict"] = nullptr;
    if (v)
        doc["verdict"] = {
            {"placement", fit_name(v->fit)},     {"fits", v->fit != Fit::none}, {"gpu_device_bytes", v->gpu_device},
            {"gpu_stream_bytes", v->gpu_stream}, {"ram_bytes", v->ram},         {"disk_bytes", v->disk},
            {"gpu_checked", v->gpu_checked},     {"reasons", v->reasons},       {"fixes", v->fixes}};
    doc["epoch"] = nullptr;
    if (e && path != Fit::none)
        doc["epoch"] = {{"data", path == Fit::device ? "device"
                                 : path == Fit::ram  ? "ram"
                                                     : "disk"},
                        {"read_bytes", e->read_bytes},
                        {"transfer_bytes", e->transfer_bytes},
                        {"read_seconds", opt(e->read_seconds)},
                        {"decode_seconds", opt(e->decode_seconds)},
                        {"transfer_seconds", opt(e->transfer_seconds)},
                        {"compute_seconds", opt(e->compute_seconds)},
                        {"epoch_seconds", opt(e->epoch_seconds)},
                        {"limited_by", e->limited_by ? json(data::stage_name(*e->limited_by)) : json(nullptr)},
                        {"io_bound", e->io_bound},
                        {"recommended_prefetch", opt(e->prefetch)},
                        {"recommended_chunk_samples", e->chunk_samples},
                        {"bench", in.rates.source.empty() ? json(nullptr) : json(in.rates.source)},
                        {"seq_read_bytes_per_second", opt(in.rates.seq_read)},
                        {"random_read_bytes_per_second", opt(in.rates.random_read)},
                        {"chunk_read_bytes_per_second", opt(in.rates.chunk_read)},
                        {"chunk_read_threads", in.rates.chunk_threads},
                        {"decode_bytes_per_second", opt(in.rates.decode)},
                        {"decode_threads", in.rates.decode_threads},
                        {"h2d_pinned_bytes_per_second", opt(in.rates.h2d_pinned)}};
    doc["table"] = nullptr;
    if (in.table) {
        json t = json::array();
        for (const TableRow& r : table) {
            json row = {{"ram_bytes", r.ram}, {"usable_bytes", r.usable}};
            for (std::size_t i = 0; i < table_types.size(); ++i)
                row["max_samples"][table_types[i] ? std::string(dtype_name(*table_types[i])) : "as_stored"] =
                    r.max_samples[i];
            t.push_back(row);
        }
        doc["table"] = t;
    }
    doc["check"] = nullptr;
    if (check_passed) doc["check"] = {{"require", fit_name(*in.require)}, {"passed", *check_passed}};
    return doc;
}

} // namespace

void run_plan(const PlanOptions& o) {
    const Inputs in = gather(o);
    const Budgets b = compute_budgets(in.machine, in.assumptions);
    const std::vector<Capacity> caps = capacity_by_dtype(in.data, in.job, b);
    std::optional<Verdict> v;
    std::optional<EpochEstimate> e;
    Fit path = Fit::none;
    if (in.data.has_samples()) {
        v = plan_placement(in.data, in.job, b);
        path = epoch_path(in, v->fit);
        e = estimate_epoch(in.data, in.job, path, in.rates, in.compute_rate, in.order == Order::full);
    }
    std::vector<std::optional<DType>> table_types;
    for (const Capacity& c : caps) table_types.push_back(c.dtype);
    const std::vector<TableRow> table =
        in.table ? quick_reference(in.data, in.job, table_types, in.assumptions) : std::vector<TableRow>{};
    std::optional<bool> passed;
    if (in.require) passed = v->fit != Fit::none && at_least(v->fit, *in.require);

    const std::optional<data::SourcePlan> data_path = data_path_plan(o, in.job.model_bytes);
    const std::optional<MixReport> mix = mix_report(o, in.datasets, b, in.rates, in.compute_rate, in.job.model_bytes);
    if (o.out.json) {
        json doc = to_json(in, b, caps, v, path, e, table, table_types, passed);
        doc["data_path"] = data_path ? data::plan_json(*data_path) : json(nullptr);
        doc["mix"] = mix ? mix_report_json(*mix) : json(nullptr);
        std::cout << doc.dump(2) << "\n";
    } else if (!o.out.quiet || !in.require) {
        print_text(in, b, caps, v, path, e, table, table_types);
        if (data_path) print_data_path(*data_path);
        if (mix) print_mix_report(*mix);
    }
    std::cout.flush();
    std::fflush(stdout);
    if (passed && !*passed)
        throw no_fit_error("check failed: placement " + std::string(fit_name(v->fit)) +
                           (v->fit == Fit::none ? " (the dataset does not fit this machine)"
                                                : " is worse than the required " + std::string(fit_name(*in.require))) +
                           (v->fixes.empty() ? "" : "; cheapest fix: " + v->fixes.front()));
}

} // namespace dstk::plan
