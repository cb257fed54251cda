// dsconvert --concat MEMBER... OUTPUT: datasets with the same fields, dtypes
// and per-sample shapes joined, in the order given, into one dataset without
// rewriting samples: each field of each split lists the members' files as
// its parts (join.hpp), hard-linked where the filesystem allows, else
// copied. The splits are the members' splits (a member without a split
// adds nothing to it); --dataset-field writes an i32 field "dataset" with
// each sample's member index; the statistics of each field are combined from
// the members'.
#include <algorithm>
#include <set>

#include "dstk/channel_stats.hpp"
#include "dstk/convert/convert.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "dstk/output.hpp"
#include "join.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

using Member = join::Input;

Member load_member(const fs::path& dir) {
    Member m{dir, load_manifest(dir)};
    if (m.m.shard)
        throw usage_error(m.name() + " is part " + std::to_string(m.m.shard->index) + "/" +
                          std::to_string(m.m.shard->count) +
                          " of a --shard run; join its parts with --merge first, then concatenate the result");
    return m;
}

std::string field_text(const FieldInfo& f) {
    return field_type_text(f.dtype, f.shape);
}

std::string storage_text(const FieldInfo& f) {
    return f.storage == Storage::npy ? "npy"
                                     : "zstd-chunked (" + std::to_string(f.chunk_samples) + " samples per chunk)";
}

std::string roles_text(const Member& m) {
    const auto role = [](const std::string& r) { return r.empty() ? std::string("none") : r; };
    return m.name() + ": input " + role(m.m.input_field) + ", label " + role(m.m.label_field);
}

// Member k's split against the first member's fields.
void check_split(const Member& first, const Member& k, const SplitInfo& split) {
    const SplitInfo& ref = first.m.splits.front();
    for (const FieldInfo& f : ref.fields) {
        const FieldInfo* g = split.find(f.name);
        if (!g)
            throw usage_error("split '" + split.name + "' of " + k.name() + " has no field '" + f.name + "', which " +
                              first.name() +
                              " has: the members of a concatenation have the same fields; add it, "
                              "or leave that member out");
        if (g->dtype != f.dtype || g->shape != f.shape)
            throw usage_error("field '" + f.name + "' is " + field_text(f) + " in " + first.name() + " but " +
                              field_text(*g) + " in " + k.name() +
                              " (the members have the same dtypes and per-sample shapes); convert one, e.g. "
                              "dsconvert --dtype " +
                              f.name + "=" + std::string(dtype_name(f.dtype)));
        if (g->storage != f.storage || g->chunk_samples != f.chunk_samples)
            throw usage_error("field '" + f.name + "' is stored as " + storage_text(f) + " in " + first.name() +
                              " but " + storage_text(*g) + " in " + k.name() +
                              " (a field's parts share one storage); convert one with dsconvert --compress and "
                              "--chunk-samples to match");
    }
    for (const FieldInfo& g : split.fields)
        if (!ref.find(g.name))
            throw usage_error(k.name() + " has a field '" + g.name + "' (split '" + split.name + "') that " +
                              first.name() + " lacks: the members of a concatenation have the same fields");
}

void check_members(const std::vector<Member>& ms, bool dataset_field) {
    const Member& first = ms.front();
    if (dataset_field && first.m.splits.front().find("dataset"))
        throw usage_error("--dataset-field adds a field 'dataset', which the members already have; drop "
                          "--dataset-field (or rename their field)");
    for (const Member& k : ms) {
        for (const SplitInfo& split : k.m.splits) check_split(first, k, split);
        if (k.m.input_field != first.m.input_field || k.m.label_field != first.m.label_field)
            throw usage_error("the members give the roles to different fields (" + roles_text(first) + "; " +
                              roles_text(k) + "); set them alike with dsconvert --input NAME --label NAME");
    }
}

// The splits of the members, in the order they first appear.
std::vector<std::string> split_names(const std::vector<Member>& ms) {
    std::vector<std::string> names;
    for (const Member& k : ms)
        for (const SplitInfo& s : k.m.splits)
            if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
    return names;
}

Manifest place_members(const std::vector<Member>& ms, join::Placer& placer) {
    Manifest whole;
    whole.input_field = ms.front().m.input_field;
    whole.label_field = ms.front().m.label_field;
    for (const std::string& name : split_names(ms)) {
        SplitInfo split;
        split.name = name;
        for (const Member& k : ms)
            if (const SplitInfo* s = k.m.find(name)) split.samples += s->samples;
        for (const FieldInfo& f : ms.front().m.splits.front().fields) {
            FieldInfo field = f;
            field.stats.reset();
            join::place_field(
                field, ms.size(),
                [&](std::size_t k) {
                    const SplitInfo* s = ms[k].m.find(name);
                    return s ? s->samples : 0;
                },
                [&](std::size_t k) {
                    const SplitInfo* s = ms[k].m.find(name);
                    return s ? s->find(f.name) : nullptr;
                },
                ms, placer);
            split.fields.push_back(std::move(field));
        }
        whole.splits.push_back(std::move(split));
    }
    return whole;
}

// --dataset-field: per split, each sample's member index (i32), in a file
// of its own.
void write_dataset_field(const std::vector<Member>& ms, AtomicDir& out, Manifest& whole) {
    std::set<std::string> taken;
    for (const SplitInfo& s : whole.splits)
        for (const FieldInfo& f : s.fields) {
            taken.insert(f.file);
            for (const FieldPart& p : f.parts) taken.insert(p.file);
        }
    for (SplitInfo& split : whole.splits) {
        std::string file = field_file_name(split.name, "dataset", ".npy");
        for (int i = 1; taken.count(file); ++i) file = split.name + "_dataset-" + std::to_string(i) + ".npy";
        NpyFieldWriter w(out.file(file), file, "dataset", DType::i32, Shape{}, split.samples);
        std::vector<std::int32_t> index;
        for (std::size_t k = 0; k < ms.size(); ++k) {
            const SplitInfo* s = ms[k].m.find(split.name);
            for (std::uint64_t left = s ? s->samples : 0; left > 0;) {
                const std::uint64_t n = std::min<std::uint64_t>(left, 1u << 20);
                index.assign(n, static_cast<std::int32_t>(k));
                w.append(index.data(), n);
                left -= n;
            }
        }
        split.fields.push_back(w.finish());
    }
}

// The split whose statistics a manifest keeps (Manifest::stats_of): train,
// else the first.
const SplitInfo* stats_split(const Manifest& m) {
    const SplitInfo* s = m.find("train");
    return s ? s : m.splits.empty() ? nullptr : &m.splits.front();
}

// Each field's statistics from the members' (weighted by their samples in
// the split of statistics); none where a member with samples has none.
void concat_stats(const std::vector<Member>& ms, const OutputOptions& out, Manifest& whole) {
    SplitInfo* target = &whole.splits.front();
    for (SplitInfo& s : whole.splits)
        if (s.name == "train") target = &s;
    for (FieldInfo& field : target->fields) {
        std::vector<ChannelStats> stats;
        std::vector<std::uint64_t> samples;
        std::string missing;
        for (const Member& k : ms) {
            const SplitInfo* s = stats_split(k.m);
            const SplitInfo* same = k.m.find(target->name);
            if (!same || same->samples == 0) continue;
            const ChannelStats* st = s == same ? k.m.stats_of(field.name) : nullptr;
            if (!st) {
                if (!missing.empty()) missing += ", ";
                missing += k.name();
                continue;
            }
            stats.push_back(*st);
            samples.push_back(same->samples);
        }
        if (stats.empty()) continue;
        std::string why;
        if (missing.empty()) field.stats = usable_stats(combine_stats(stats, samples), why);
        if (!field.stats)
            note(out, "no statistics written for field " + field.name + ": " +
                          (missing.empty() ? why : missing + " has none for it"));
    }
    if (const ChannelStats* st = whole.stats_of(whole.input_field)) whole.stats = *st;
}

void describe_concat(const ConvertOptions& o, const std::vector<Member>& ms, Manifest& whole) {
    concat_stats(ms, o.out, whole);
    for (const Member& k : ms)
        if (k.m.num_classes && (!whole.num_classes || *k.m.num_classes > *whole.num_classes))
            whole.num_classes = k.m.num_classes;
    std::string members;
    for (const Member& k : ms) members += (members.empty() ? "" : ", ") + k.dir.string();
    whole.provenance.tool = "dsconvert";
    whole.provenance.version = DSTK_VERSION;
    whole.provenance.command_line = o.command_line;
    whole.provenance.created = now_iso8601();
    whole.provenance.params["concatenated"] = members;
    if (o.dataset_field) whole.provenance.params["dataset_field"] = "dataset";
}

} // namespace

void run_concat(const ConvertOptions& o) {
    join::check_options(o, o.concat_members, "--concat");
    if (o.concat_members.size() < 2)
        throw usage_error("--concat joins two or more datasets: dsconvert --concat A/ B/ ... OUTPUT");
    if (o.concat_members.size() > static_cast<std::size_t>(INT32_MAX))
        throw usage_error("--concat: too many members for an i32 dataset index");
    std::vector<Member> ms;
    for (const auto& dir : o.concat_members) ms.push_back(load_member(dir));
    check_members(ms, o.dataset_field);
    join::check_files(ms);
    AtomicDir out(o.output, o.force);
    join::Placer placer(out, o.move, !o.move, o.out);
    Manifest whole = place_members(ms, placer);
    if (o.dataset_field) write_dataset_field(ms, out, whole);
    describe_concat(o, ms, whole);
    join::commit(out, whole);
    placer.done();
    if (o.move) join::remove_moved_inputs(ms);
    join::report(o, "concatenated " + std::to_string(ms.size()) + " datasets", ms.size(), whole, placer);
}

} // namespace dstk
