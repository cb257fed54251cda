// dsconvert --merge PART... OUTPUT: the outputs of a --shard I/N run joined
// into one dataset without copying samples. The parts are checked first
// (all N, in order, from one run's settings, their ranges contiguous and
// their files the sizes their manifests say); then each part's files are
// hard-linked (or, with --move, renamed) into OUTPUT (join.hpp).
#include "dstk/chunked_file.hpp"
#include "dstk/convert/convert.hpp"
#include "dstk/error.hpp"
#include "dstk/shard.hpp"
#include "join.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

using Part = join::Input;

std::string part_label(std::uint64_t i, std::uint64_t n) {
    return std::to_string(i) + "/" + std::to_string(n);
}

Part load_part(const fs::path& dir) {
    Part p{dir, load_manifest(dir)};
    if (!p.m.shard)
        throw usage_error(p.name() + " is not a --shard output (its " + std::string(manifest_file_name) +
                          " has no \"shard\" record); --merge joins the parts written by dsgen or dsconvert "
                          "--shard I/N");
    return p;
}

// All N parts, each at its index.
void check_complete(const std::vector<Part>& parts) {
    const std::uint64_t n = parts.front().m.shard->count;
    for (std::size_t k = 0; k < parts.size(); ++k) {
        const ShardInfo& sh = *parts[k].m.shard;
        if (sh.count != n)
            throw usage_error(parts[k].name() + " is part " + part_label(sh.index, sh.count) + " but " +
                              parts.front().name() + " is part " + part_label(parts.front().m.shard->index, n) +
                              " (parts of different --shard runs)");
        for (std::size_t e = 0; e < k; ++e)
            if (parts[e].m.shard->index == sh.index)
                throw usage_error(parts[e].name() + " and " + parts[k].name() + " are both part " +
                                  part_label(sh.index, n) + "; give each part once");
    }
    if (parts.size() < n) {
        std::string missing;
        for (std::uint64_t i = 0; i < n; ++i) {
            bool found = false;
            for (const auto& p : parts) found |= p.m.shard->index == i;
            if (!found) missing += (missing.empty() ? "" : ", ") + part_label(i, n);
        }
        throw usage_error("missing part" + std::string(n - parts.size() > 1 ? "s " : " ") + missing +
                          " (the merge needs all " + std::to_string(n) + " parts of the --shard run)");
    }
    for (std::size_t k = 0; k < parts.size(); ++k)
        if (parts[k].m.shard->index != k)
            throw usage_error("parts out of order: " + parts[k].name() + " is part " +
                              part_label(parts[k].m.shard->index, n) + " but is given at position " +
                              std::to_string(k) + "; give the parts in order 0.." + std::to_string(n - 1) +
                              " (e.g. sort -V, or name them with zero-padded numbers)");
}

bool same_field(const FieldInfo& a, const FieldInfo& b) {
    return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.storage == b.storage &&
           a.chunk_samples == b.chunk_samples;
}

// One run's settings, splits, fields and contiguous ranges.
void check_same_run(const std::vector<Part>& parts) {
    const Part& p0 = parts.front();
    for (const Part& p : parts) {
        const auto differ = [&](const std::string& what) {
            return usage_error(p.name() + " and " + p0.name() + " differ in " + what +
                               ": they are not parts of one dataset (the parts come from one command, only "
                               "--shard I differing)");
        };
        if (p.m.shard->settings != p0.m.shard->settings || p.m.shard->chunk_samples != p0.m.shard->chunk_samples)
            throw differ("their settings (" + p.m.shard->settings + " vs " + p0.m.shard->settings + ")");
        if (p.m.provenance.tool != p0.m.provenance.tool) throw differ("the tool that wrote them");
        if (p.m.input_field != p0.m.input_field || p.m.label_field != p0.m.label_field) throw differ("their fields");
        if (p.m.splits.size() != p0.m.splits.size()) throw differ("their splits");
        for (std::size_t s = 0; s < p.m.splits.size(); ++s) {
            const SplitInfo &a = p.m.splits[s], &b = p0.m.splits[s];
            bool same = a.name == b.name && a.fields.size() == b.fields.size() &&
                        p.m.shard->splits[s].total == p0.m.shard->splits[s].total;
            for (std::size_t f = 0; same && f < a.fields.size(); ++f) same = same_field(a.fields[f], b.fields[f]);
            if (!same) throw differ("split '" + a.name + "' (its fields, dtypes, shapes, storage or size)");
        }
    }
    for (std::size_t s = 0; s < p0.m.splits.size(); ++s) {
        std::uint64_t end = 0;
        for (const Part& p : parts) {
            const ShardSplit& r = p.m.shard->splits[s];
            const std::uint64_t n = p.m.splits[s].samples;
            if (r.first != end)
                throw usage_error(p.name() + " holds samples [" + std::to_string(r.first) + ", " +
                                  std::to_string(r.first + n) + ") of split '" + r.name + "' but the parts before " +
                                  "it end at " + std::to_string(end) + " (overlapping or missing samples)");
            end += n;
        }
        const std::uint64_t total = p0.m.shard->splits[s].total;
        if (end != total)
            throw usage_error("the parts hold " + std::to_string(end) + " samples of split '" + p0.m.splits[s].name +
                              "', which has " + std::to_string(total));
    }
}

// The sums of rows a shard record keeps for a field (rows(part) gives them)
// as the field's statistics over the split's samples; nullopt where no part
// has rows.
template <typename Rows>
std::optional<ChannelStats> stats_from_rows(const std::vector<Part>& parts, const SplitInfo& split,
                                            const FieldInfo& field, Rows rows, std::uint64_t chunk_samples) {
    const std::vector<double>* first_row = nullptr;
    for (const Part& p : parts)
        if (!rows(p).empty() && !first_row) first_row = &rows(p).front();
    if (!first_row) return std::nullopt;
    ChannelSums sums(first_row->size() / 2);
    std::uint64_t n = 0;
    for (const Part& p : parts)
        for (const auto& row : rows(p)) {
            sums.add(row);
            ++n;
        }
    const std::uint64_t chunks = chunk_count(split.samples, chunk_samples);
    if (n != chunks || sums.channels() == 0)
        throw runtime_error("the parts' per-chunk sums of field '" + field.name + "' cover " + std::to_string(n) +
                            " chunks of split '" + split.name + "', which has " + std::to_string(chunks) +
                            " (a part's dataset.json edited?); re-run the parts");
    const double per_channel = static_cast<double>(field.shape.numel() / sums.channels());
    std::string why;
    return usable_stats(sums.stats(static_cast<double>(split.samples) * per_channel), why);
}

// The statistics of the whole: from the parts' per-chunk sums (dsgen's for
// the input field, dsconvert's per field), which a single run adds in the
// same order (identical statistics); else the parts' own, which must agree
// (parts that carried their input's statistics).
void merge_stats(const std::vector<Part>& parts, Manifest& whole) {
    const Part& p0 = parts.front();
    const std::uint64_t chunk = p0.m.shard->chunk_samples;
    bool input_rows = false; // the input's statistics come from rows, usable or not
    for (std::size_t s = 0; s < whole.splits.size(); ++s) {
        SplitInfo& split = whole.splits[s];
        for (FieldInfo& field : split.fields) {
            field.stats.reset();
            const auto rows = [&](const Part& p) -> const std::vector<std::vector<double>>& {
                static const std::vector<std::vector<double>> none;
                const ShardSplit& sh = p.m.shard->splits[s];
                if (const auto it = sh.field_chunk_sums.find(field.name); it != sh.field_chunk_sums.end())
                    return it->second;
                return field.name == whole.input_field ? sh.chunk_sums : none;
            };
            field.stats = stats_from_rows(parts, split, field, rows, chunk);
            for (const Part& p : parts) input_rows |= field.name == whole.input_field && !rows(p).empty();
        }
    }
    if (input_rows) {
        const ChannelStats* st = whole.stats_of(whole.input_field);
        whole.stats = st ? std::optional<ChannelStats>(*st) : std::nullopt;
        return;
    }
    for (const Part& p : parts) {
        const bool same = p.m.stats.has_value() == p0.m.stats.has_value() &&
                          (!p.m.stats || (p.m.stats->mean == p0.m.stats->mean && p.m.stats->std == p0.m.stats->std));
        if (!same)
            throw usage_error(p.name() + " and " + p0.name() +
                              " carry different per-channel stats: they are not parts of one dataset");
    }
    whole.stats = p0.m.stats;
}

// The merged fields: one file where a single part holds samples, else parts.
Manifest place_parts(const std::vector<Part>& parts, join::Placer& placer) {
    const Part& p0 = parts.front();
    Manifest whole = p0.m;
    whole.shard.reset();
    for (std::size_t s = 0; s < whole.splits.size(); ++s) {
        SplitInfo& split = whole.splits[s];
        split.samples = p0.m.shard->splits[s].total;
        for (std::size_t f = 0; f < split.fields.size(); ++f)
            join::place_field(
                split.fields[f], parts.size(), [&](std::size_t k) { return parts[k].m.splits[s].samples; },
                [&](std::size_t k) { return &parts[k].m.splits[s].fields[f]; }, parts, placer);
    }
    return whole;
}

void describe_merge(const ConvertOptions& o, const std::vector<Part>& parts, Manifest& whole) {
    merge_stats(parts, whole);
    for (const Part& p : parts)
        if (p.m.num_classes && (!whole.num_classes || *p.m.num_classes > *whole.num_classes))
            whole.num_classes = p.m.num_classes; // dsconvert parts count the classes they saw
    whole.provenance.params["merged_parts"] = std::to_string(parts.size());
    whole.provenance.params["merged_by"] = o.command_line;
}

} // namespace

void run_merge(const ConvertOptions& o) {
    join::check_options(o, o.merge_parts, "--merge");
    std::vector<Part> parts;
    for (const auto& dir : o.merge_parts) parts.push_back(load_part(dir));
    check_complete(parts);
    check_same_run(parts);
    for (const Part& p : parts)
        for (const auto& s : p.m.splits)
            for (const auto& f : s.fields)
                if (!f.parts.empty()) throw usage_error(p.name() + " is itself merged; merge --shard outputs");
    join::check_files(parts);
    AtomicDir out(o.output, o.force);
    Manifest whole;
    {
        join::Placer placer(out, o.move, false, o.out);
        whole = place_parts(parts, placer);
        describe_merge(o, parts, whole);
        join::commit(out, whole);
        placer.done();
        if (o.move) join::remove_moved_inputs(parts);
        join::report(o, "merged " + std::to_string(parts.size()) + " parts", parts.size(), whole, placer);
    }
}

} // namespace dstk
