// The sizing model of dsplan: pure functions, exact integer arithmetic
// (man/dsplan.1, FORMULAS).
#include "dstk/plan/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "dstk/error.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/manifest.hpp"
#include "dstk/npy.hpp"
#include "dstk/units.hpp"

namespace dstk::plan {
namespace {

using u128 = unsigned __int128;
constexpr std::uint64_t million = 1'000'000;

std::uint64_t headroom_of(std::uint64_t bytes, std::uint32_t ppm) {
    return static_cast<std::uint64_t>((u128{bytes} * ppm + (million - 1)) / million);
}

std::uint64_t header_bytes(DType t, std::uint64_t n, const Shape& shape) {
    std::vector<std::uint64_t> dims{n};
    dims.insert(dims.end(), shape.dims.begin(), shape.dims.end());
    return make_npy_header(t, dims).size();
}

std::string dtype_str(DType t) {
    return std::string(dtype_name(t));
}

// The placement alone, without fixes (fixes try other dtypes and recurse).
Verdict place(const DataSpec& d, const Job& j, const Budgets& b) {
    Verdict v;
    const std::uint64_t model = j.model_bytes.value_or(0);
    const std::uint64_t ring = ring_bytes(d, j);
    const std::uint64_t data = dataset_bytes(d);
    v.gpu_device = checked_add(data, model, "GPU bytes");
    v.gpu_stream = checked_add(ring, model, "GPU bytes");
    v.ram = checked_add(data, ring, "RAM bytes");
    v.disk = d.on_disk ? 0 : disk_bytes(d);
    v.gpu_checked = b.gpu.known();

    if (b.gpu.known() && v.gpu_stream > b.gpu.bytes) {
        v.fit = Fit::none;
        v.reasons.push_back("the streaming footprint on the GPU (" + format_bytes(v.gpu_stream) + ": " +
                            std::to_string(j.prefetch) + " ring slots of " + std::to_string(j.batch) + " samples" +
                            (j.model_bytes ? " plus the model" : "") + ") exceeds the GPU budget of " +
                            format_bytes(b.gpu.bytes));
        return v;
    }
    // Every placement loads the data from its dataset directory: it must fit on disk first.
    if (!d.on_disk && b.disk.known() && v.disk > b.disk.bytes) {
        v.reasons.push_back("the dataset (" + format_bytes(v.disk) + ") exceeds the disk budget of " +
                            format_bytes(b.disk.bytes) + " (every placement reads it from disk first)");
        v.fit = Fit::none;
        return v;
    }
    if (!d.on_disk && !b.disk.known()) v.reasons.push_back("disk not checked: free disk unknown (give --disk)");
    if (b.gpu.known() && v.gpu_device <= b.gpu.bytes) {
        v.fit = Fit::device;
        return v;
    }
    v.reasons.push_back(b.gpu.known() ? "not device: the data" + std::string(j.model_bytes ? " plus the model" : "") +
                                            " (" + format_bytes(v.gpu_device) + ") exceeds the GPU budget of " +
                                            format_bytes(b.gpu.bytes)
                                      : "not device: GPU memory unknown (give --gpu-mem to plan for a GPU)");
    if (b.ram.known() && v.ram <= b.ram.bytes) {
        v.fit = Fit::ram;
        return v;
    }
    v.reasons.push_back(!b.ram.known()     ? "not ram: RAM size unknown (give --ram)"
                        : b.ram.bytes == 0 ? "not ram: the OS reserve of " + format_bytes(b.assumptions.os_reserve) +
                                                 " (--os-reserve) leaves no RAM budget"
                                           : "not ram: the data and the pinned ring (" + format_bytes(v.ram) +
                                                 ") exceed the RAM budget of " + format_bytes(b.ram.bytes));
    v.fit = Fit::disk;
    return v;
}

std::vector<std::string> fixes_for_gpu(const DataSpec& d, const Job& j, const Budgets& b) {
    std::vector<std::string> fixes;
    const std::uint64_t model = j.model_bytes.value_or(0);
    const std::uint64_t slot_sample = checked_mul(bytes_per_sample(d), j.prefetch, "ring bytes");
    const std::uint64_t batch = b.gpu.bytes > model ? (b.gpu.bytes - model) / slot_sample : 0;
    if (batch >= 1)
        fixes.push_back("a smaller batch: --batch " + std::to_string(std::min<std::uint64_t>(batch, j.batch - 1)) +
                        " or less fits with --prefetch " + std::to_string(j.prefetch));
    if (j.prefetch > 2) {
        Job shallow = j;
        shallow.prefetch = 2;
        if (checked_add(ring_bytes(d, shallow), model, "GPU bytes") <= b.gpu.bytes)
            fixes.push_back("a shallower ring: --prefetch 2");
    }
    if (j.model_bytes) fixes.push_back("a smaller model");
    fixes.push_back("a GPU with at least " +
                    format_bytes(capacity_needed(checked_add(ring_bytes(d, j), model, "GPU bytes"), 0,
                                                 b.assumptions.headroom_ppm)) +
                    " of free memory");
    return fixes;
}

std::vector<std::string> fixes_for_disk(const DataSpec& d, const Job& j, const Budgets& b, const Verdict& v) {
    std::vector<std::string> fixes;
    // Smaller dtypes, the least precision lost first.
    for (const DType t : {DType::bf16, DType::u8}) {
        if (!d.input_field() || dtype_size(t) >= dtype_size(d.input_field()->dtype)) continue;
        const DataSpec c = with_dtype(d, t);
        const Verdict cv = place(c, j, b);
        if (cv.fit == Fit::none) continue;
        fixes.push_back("store the input as " + dtype_str(t) + (t == DType::u8 ? " (if the values are 8-bit)" : "") +
                        ": " + format_bytes(disk_bytes(c)) + ", placement " + std::string(fit_name(cv.fit)) +
                        " (dsconvert --dtype " + dtype_str(t) + ")");
        break;
    }
    if (!b.disk.known()) return fixes;
    std::string compress;
    double ratio = 0;
    if (b.disk.bytes > 0) {
        ratio = static_cast<double>(v.disk) / static_cast<double>(b.disk.bytes);
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f", ratio);
        compress = std::string("compress it: zstd-chunked storage needs a ratio of at least ") + buf +
                   ":1 to fit (dsconvert --compress zstd; dsbench measures the ratio)";
    }
    // Past 2:1 compression is a gamble (natural u8 images reach 1.3-1.5:1): fewer samples come first.
    const bool plausible = !compress.empty() && ratio <= plausible_zstd_ratio;
    if (plausible) fixes.push_back(compress);
    const std::uint64_t fit = max_samples(b.disk.bytes, bytes_per_sample(d), npy_overhead(d));
    if (fit > 0) fixes.push_back("fewer samples: at most " + format_count(fit) + " fit on disk");
    if (!plausible && !compress.empty()) fixes.push_back(compress);
    const std::uint64_t need = capacity_needed(v.disk, 0, b.assumptions.headroom_ppm);
    fixes.push_back("more disk: " + format_bytes(need - std::min(need, b.disk_free)) +
                    " more free space (--dir elsewhere, or a larger disk)");
    return fixes;
}

} // namespace

std::string_view source_name(Source s) {
    static constexpr EnumNames<Source, 3> names{
        {{{Source::detected, "detected"}, {Source::given, "given"}, {Source::unknown, "unknown"}}}};
    return names.name(s);
}

std::uint32_t parse_headroom(std::string_view text) {
    std::string_view t = text;
    if (!t.empty() && t.back() == '%') t.remove_suffix(1);
    const std::string s(t);
    std::size_t used = 0;
    double pct = -1;
    const bool plain = !s.empty() && s.find_first_not_of("0123456789.") == std::string::npos;
    try {
        if (plain) pct = std::stod(s, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    const long long ppm = used == s.size() && pct >= 0 && pct < 100 ? std::llround(pct * 10'000) : -1;
    if (ppm < 0 || ppm >= static_cast<long long>(million))
        throw usage_error("invalid --headroom '" + std::string(text) +
                          "' (expected a percentage from 0 to below 100, e.g. 20%)");
    return static_cast<std::uint32_t>(ppm);
}

std::string format_headroom(std::uint32_t ppm) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g%%", ppm / 10'000.0);
    return buf;
}

std::uint64_t usable_bytes(std::uint64_t capacity, std::uint64_t reserve, std::uint32_t headroom_ppm) {
    const std::uint64_t after = capacity > reserve ? capacity - reserve : 0;
    return after - headroom_of(after, headroom_ppm);
}

std::uint64_t capacity_needed(std::uint64_t need, std::uint64_t reserve, std::uint32_t headroom_ppm) {
    if (need == 0) return 0;
    const u128 after = (u128{need} * million + (million - headroom_ppm - 1)) / (million - headroom_ppm);
    u128 c = after + reserve;
    if (c > UINT64_MAX) throw usage_error("the capacity needed for " + format_bytes(need) + " is over 2^64 bytes");
    auto cap = static_cast<std::uint64_t>(c);
    // Rounding of the headroom: settle on the smallest capacity that is enough.
    while (usable_bytes(cap, reserve, headroom_ppm) < need) ++cap;
    while (cap > reserve && usable_bytes(cap - 1, reserve, headroom_ppm) >= need) --cap;
    return cap;
}

Budgets compute_budgets(const Machine& m, const Assumptions& a) {
    Budgets b;
    b.assumptions = a;
    if (m.ram.known()) b.ram = {usable_bytes(m.ram.bytes, a.os_reserve, a.headroom_ppm), m.ram.source};
    if (m.disk.known()) b.disk = {usable_bytes(m.disk.bytes, 0, a.headroom_ppm), m.disk.source};
    if (m.gpu.known()) b.gpu = {usable_bytes(m.gpu.bytes, 0, a.headroom_ppm), m.gpu.source};
    b.disk_free = m.disk.bytes;
    return b;
}

FieldSpec parse_field_spec(std::string_view text) {
    const auto bad = [&](const std::string& why) {
        return usage_error("invalid --field '" + std::string(text) + "' (" + why +
                           "); give NAME:SHAPE:DTYPE, e.g. --field robs:120:f32, --field stim:1x36x36:u8, or "
                           "--field moves::i32 for one value per sample");
    };
    const auto a = text.find(':');
    const auto b = a == std::string_view::npos ? a : text.find(':', a + 1);
    if (b == std::string_view::npos || text.find(':', b + 1) != std::string_view::npos)
        throw bad("expected three parts separated by ':'");
    FieldSpec f;
    f.name = std::string(text.substr(0, a));
    if (f.name.empty()) throw bad("the NAME is empty");
    const std::string_view shape = text.substr(a + 1, b - a - 1);
    if (!shape.empty()) f.shape = parse_shape(shape, "--field " + f.name + " shape");
    f.dtype = parse_dtype(text.substr(b + 1), "--field " + f.name + " dtype");
    (void)f.bytes(); // an overflowing shape is a usage error here
    return f;
}

DataSpec input_and_label(const Shape& shape, DType dtype, std::optional<DType> label) {
    DataSpec d;
    d.fields.push_back({"x", shape, dtype});
    d.input = 0;
    if (label) {
        d.fields.push_back({"y", Shape{}, *label});
        d.label = 1;
    }
    return d;
}

// The data with the input field stored as `t` (nullopt, or no input field: as it is).
DataSpec with_dtype(const DataSpec& d, std::optional<DType> t) {
    DataSpec c = d;
    if (t && d.input && *t != d.fields[*d.input].dtype) {
        c.fields[*d.input].dtype = *t;
        c.stored_bytes.reset(); // a converted dataset is a new one, in the npy layout
        c.on_disk = false;
        c.compressed = false;
    }
    return c;
}

std::uint64_t input_bytes_per_sample(const DataSpec& d) {
    return d.input ? d.fields.at(*d.input).bytes() : 0;
}

std::uint64_t label_bytes_per_sample(const DataSpec& d) {
    return d.label ? d.fields.at(*d.label).bytes() : 0;
}

std::uint64_t bytes_per_sample(const DataSpec& d) {
    std::uint64_t total = 0;
    for (const FieldSpec& f : d.fields) total = checked_add(total, f.bytes(), "bytes per sample");
    return total;
}

std::uint64_t widest_field_bytes(const DataSpec& d) {
    std::uint64_t widest = 0;
    for (const FieldSpec& f : d.fields) widest = std::max(widest, f.bytes());
    return widest;
}

std::uint64_t total_samples(const DataSpec& d) {
    return checked_add(d.train, d.test, "samples");
}

std::uint64_t dataset_bytes(const DataSpec& d) {
    return checked_mul(total_samples(d), bytes_per_sample(d), "dataset size");
}

std::uint64_t input_bytes(const DataSpec& d) {
    return checked_mul(total_samples(d), input_bytes_per_sample(d), "dataset size");
}

std::uint64_t npy_overhead(const DataSpec& d) {
    std::uint64_t total = 0;
    for (const std::uint64_t n : {d.train, d.test}) {
        if (n == 0) continue;
        for (const FieldSpec& f : d.fields) total += header_bytes(f.dtype, n, f.shape);
    }
    return total;
}

std::uint64_t disk_bytes(const DataSpec& d) {
    if (d.stored_bytes) return *d.stored_bytes;
    return checked_add(dataset_bytes(d), npy_overhead(d), "dataset size");
}

namespace {

std::string field_desc(const FieldSpec& f) {
    return f.name + ' ' + field_type_text(f.dtype, f.shape);
}

} // namespace

DataSpec combine_data(const std::vector<NamedData>& members) {
    if (members.empty()) throw usage_error("internal: combine_data of no data");
    DataSpec all = members.front().data;
    all.train = all.test = 0;
    all.stored_bytes = std::uint64_t{0};
    const DataSpec& ref = members.front().data;
    for (const NamedData& m : members) {
        const DataSpec& d = m.data;
        bool same = d.fields.size() == ref.fields.size();
        for (const FieldSpec& f : ref.fields) {
            const auto g =
                std::find_if(d.fields.begin(), d.fields.end(), [&](const FieldSpec& x) { return x.name == f.name; });
            same = same && g != d.fields.end() && g->dtype == f.dtype && g->shape == f.shape;
        }
        if (!same) {
            std::string a, b;
            for (const FieldSpec& f : ref.fields) a += (a.empty() ? "" : ", ") + field_desc(f);
            for (const FieldSpec& f : d.fields) b += (b.empty() ? "" : ", ") + field_desc(f);
            throw usage_error("'" + m.name + "' has fields " + b + " but '" + members.front().name + "' has " + a +
                              ": datasets sized together have the same fields, dtypes and shapes; plan them one "
                              "at a time");
        }
        all.train = checked_add(all.train, d.train, "samples");
        all.test = checked_add(all.test, d.test, "samples");
        all.stored_bytes = checked_add(*all.stored_bytes, disk_bytes(d), "dataset size");
        all.compressed |= d.compressed;
    }
    return all;
}

std::uint64_t ring_bytes(const DataSpec& d, const Job& j) {
    return checked_mul(checked_mul(j.prefetch, j.batch, "ring size"), bytes_per_sample(d), "ring size");
}

namespace {
constexpr EnumNames<Fit, 4> fit_names{
    {{{Fit::device, "device"}, {Fit::ram, "ram"}, {Fit::disk, "disk"}, {Fit::none, "none"}}}};
// --require names a budget the data must fit: "none" is no requirement.
constexpr EnumNames<Fit, 3> required_fit_names{{{{Fit::device, "device"}, {Fit::ram, "ram"}, {Fit::disk, "disk"}}}};
} // namespace

std::string_view fit_name(Fit f) {
    return fit_names.name(f);
}

Fit parse_fit(std::string_view text) {
    return required_fit_names.parse(text, "--require");
}

Verdict plan_placement(const DataSpec& d, const Job& j, const Budgets& b) {
    Verdict v = place(d, j, b);
    if (v.fit != Fit::none) return v;
    if (b.gpu.known() && v.gpu_stream > b.gpu.bytes)
        v.fixes = fixes_for_gpu(d, j, b);
    else
        v.fixes = fixes_for_disk(d, j, b, v);
    return v;
}

std::uint64_t max_samples(std::uint64_t budget, std::uint64_t per_sample, std::uint64_t fixed) {
    if (per_sample == 0) throw usage_error("samples of 0 bytes cannot be sized");
    return budget > fixed ? (budget - fixed) / per_sample : 0;
}

std::vector<Capacity> capacity_by_dtype(const DataSpec& d, const Job& j, const Budgets& b) {
    std::vector<std::optional<DType>> types{std::nullopt};
    if (const FieldSpec* x = d.input_field()) {
        types = {x->dtype};
        for (const DType t : {DType::u8, DType::bf16, DType::f32})
            if (dtype_size(t) != dtype_size(x->dtype)) types.push_back(t);
    }
    std::vector<Capacity> out;
    for (const std::optional<DType> t : types) {
        const DataSpec c = with_dtype(d, t);
        Capacity cap;
        cap.dtype = t;
        cap.bytes_per_sample = bytes_per_sample(c);
        const std::uint64_t model = j.model_bytes.value_or(0);
        if (b.ram.known()) cap.ram_samples = max_samples(b.ram.bytes, cap.bytes_per_sample, ring_bytes(c, j));
        if (b.disk.known()) {
            // The npy headers for as many samples as could fit (their size grows with the digits).
            DataSpec most = c;
            most.train = std::max<std::uint64_t>(1, b.disk.bytes / cap.bytes_per_sample);
            most.test = 0;
            cap.disk_samples = max_samples(b.disk.bytes, cap.bytes_per_sample, npy_overhead(most));
        }
        if (b.gpu.known()) cap.gpu_samples = max_samples(b.gpu.bytes, cap.bytes_per_sample, model);
        if (d.has_samples()) {
            cap.dataset_bytes = dataset_bytes(c);
            cap.fit = place(c, j, b).fit;
        }
        out.push_back(cap);
    }
    return out;
}

std::vector<std::uint64_t> table_ram_sizes() {
    std::vector<std::uint64_t> sizes;
    for (std::uint64_t g = 16; g <= 1024; g *= 2) sizes.push_back(g << 30);
    return sizes;
}

std::vector<TableRow> quick_reference(const DataSpec& d, const Job& j, std::span<const std::optional<DType>> columns,
                                      const Assumptions& a) {
    std::vector<TableRow> rows;
    for (const std::uint64_t ram : table_ram_sizes()) {
        TableRow r;
        r.ram = ram;
        r.usable = usable_bytes(ram, a.os_reserve, a.headroom_ppm);
        for (const std::optional<DType> t : columns) {
            const DataSpec c = with_dtype(d, t);
            r.max_samples.push_back(max_samples(r.usable, bytes_per_sample(c), ring_bytes(c, j)));
        }
        rows.push_back(std::move(r));
    }
    return rows;
}

void settle_epoch(EpochEstimate& e) {
    // Ties go to compute: a data stage as fast as the GPU does not limit it.
    const std::pair<data::Stage, std::optional<double>> terms[] = {{data::Stage::compute, e.compute_seconds},
                                                                   {data::Stage::read, e.read_seconds},
                                                                   {data::Stage::decode, e.decode_seconds},
                                                                   {data::Stage::h2d, e.transfer_seconds}};
    std::optional<double> data;
    for (const auto& [stage, t] : terms) {
        if (!t) continue;
        if (!e.epoch_seconds || *t > *e.epoch_seconds) {
            e.epoch_seconds = t;
            e.limited_by = stage;
        }
        if (stage != data::Stage::compute && (!data || *t > *data)) data = t;
    }
    if (data && e.compute_seconds) {
        e.io_bound = *data > *e.compute_seconds;
        // One slot in compute, one being filled, plus one per compute step that a
        // data batch takes longer: readers in parallel keep the ring full.
        const double ratio = *data / *e.compute_seconds;
        e.prefetch = static_cast<std::uint32_t>(std::min(16.0, 2.0 + std::floor(ratio)));
    }
}

EpochEstimate estimate_epoch(const DataSpec& d, const Job& j, Fit p, const Rates& r, double compute_rate,
                             bool random_order) {
    EpochEstimate e;
    const std::uint64_t samples = total_samples(d);
    // The widest field sets the chunk, as dsconvert's --chunk-size does.
    const std::uint64_t in_batch = checked_mul(j.batch, widest_field_bytes(d), "batch bytes");
    e.chunk_samples = std::uint64_t{j.batch} * std::max<std::uint64_t>(1, (min_chunk_bytes + in_batch - 1) / in_batch);
    // A chunk larger than the dataset would just be the dataset.
    if (samples > 0) e.chunk_samples = std::min(e.chunk_samples, samples);
    if (d.train == 0 || p == Fit::none) return e;

    if (p == Fit::disk) {
        // Compressed or not, a training epoch reads the train split's share of the files.
        e.read_bytes = d.stored_bytes && samples > 0
                           ? static_cast<std::uint64_t>(u128{*d.stored_bytes} * d.train / samples)
                           : checked_mul(d.train, bytes_per_sample(d), "epoch bytes");
        const std::optional<double> rate = random_order ? r.random_read : r.chunk_read ? r.chunk_read : r.seq_read;
        if (rate && *rate > 0) e.read_seconds = static_cast<double>(e.read_bytes) / *rate;
        if (d.compressed && r.decode && *r.decode > 0)
            e.decode_seconds =
                static_cast<double>(checked_mul(d.train, bytes_per_sample(d), "epoch bytes")) / *r.decode;
    }
    if (p != Fit::device) {
        e.transfer_bytes = checked_mul(d.train, bytes_per_sample(d), "epoch bytes");
        if (r.h2d_pinned && *r.h2d_pinned > 0)
            e.transfer_seconds = static_cast<double>(e.transfer_bytes) / *r.h2d_pinned;
    }
    if (compute_rate > 0) e.compute_seconds = static_cast<double>(d.train) / compute_rate;

    settle_epoch(e);
    if (p == Fit::device) e.prefetch.reset();
    return e;
}

} // namespace dstk::plan
