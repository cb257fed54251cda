// dsconvert --merge PART... OUTPUT: the outputs of a --shard I/N run joined
// into one dataset without copying samples. The parts are checked first
// (all N, in order, from one run's settings, their ranges contiguous and
// their files the sizes their manifests say); then each part's files are
// hard-linked (or, with --move, renamed) into OUTPUT's staging directory,
// whose manifest lists every field's parts, and the directory is renamed
// into place. Nothing is lost on failure: links leave the parts as they
// were, and moved files are moved back.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/convert/convert.hpp"
#include "dstk/error.hpp"
#include "dstk/output.hpp"
#include "dstk/shard.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

struct Part {
    fs::path dir;
    Manifest m;
    std::string name() const { return "'" + dir.string() + "'"; }
};

std::string part_label(std::uint64_t i, std::uint64_t n) {
    return std::to_string(i) + "/" + std::to_string(n);
}

void check_merge_options(const ConvertOptions& o) {
    const bool other = o.shard || o.dtype || o.scale || o.offset || !o.range.empty() || o.compress != "none" ||
                       o.chunk_samples || o.chunk_bytes || o.shuffle_seed || !o.split.empty() || !o.select.empty() ||
                       o.resume || o.to || o.verify_only || o.benchmark || o.from != InputFormat::automatic ||
                       o.raw.shape || o.raw.dtype || !o.raw.labels.empty() || !o.raw.x_array.empty() ||
                       !o.raw.y_array.empty() || o.num_classes || !o.report_json.empty();
    if (other)
        throw usage_error("--merge only joins parts (their samples are not rewritten); drop the conversion options, "
                          "and convert the merged dataset afterwards if needed");
    for (const auto& p : o.merge_parts) {
        std::error_code ec;
        if (fs::exists(o.output, ec) && fs::equivalent(p, o.output, ec))
            throw usage_error("--merge OUTPUT '" + o.output.string() + "' is one of the parts; give a new directory");
    }
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

// The files are what the parts' manifests say (size; the checksums are
// carried over, and dsconvert --verify re-reads them).
void check_files(const std::vector<Part>& parts) {
    for (const Part& p : parts)
        for (const auto& s : p.m.splits)
            for (const auto& f : s.fields) {
                if (!f.parts.empty()) throw usage_error(p.name() + " is itself merged; merge --shard outputs");
                const fs::path path = p.dir / f.file;
                struct stat st {};
                if (::lstat(path.c_str(), &st) != 0)
                    throw runtime_error("cannot read '" + path.string() + "' (" + std::strerror(errno) +
                                        "); re-run that part");
                if (!S_ISREG(st.st_mode))
                    throw runtime_error("'" + path.string() + "' is not a regular file; re-run that part");
                if (static_cast<std::uint64_t>(st.st_size) != f.bytes)
                    throw runtime_error("'" + path.string() + "' has " + std::to_string(st.st_size) + " bytes but " +
                                        p.name() + " says " + std::to_string(f.bytes) +
                                        " (file truncated or modified?); re-run that part");
            }
}

// dsgen's per-chunk sums give the stats of a single run; other parts carry
// their input's stats, which must agree.
std::optional<ChannelStats> merged_stats(const std::vector<Part>& parts, const Manifest& whole) {
    const Part& p0 = parts.front();
    for (std::size_t s = 0; s < p0.m.splits.size(); ++s) {
        bool any = false;
        for (const Part& p : parts) any |= !p.m.shard->splits[s].chunk_sums.empty();
        if (!any) continue;
        const std::vector<double>* first_row = nullptr;
        for (const Part& p : parts)
            if (!p.m.shard->splits[s].chunk_sums.empty()) first_row = &p.m.shard->splits[s].chunk_sums.front();
        ChannelSums sums(first_row->size() / 2);
        std::uint64_t rows = 0;
        for (const Part& p : parts)
            for (const auto& row : p.m.shard->splits[s].chunk_sums) {
                sums.add(row);
                ++rows;
            }
        const SplitInfo& split = whole.splits[s];
        if (rows != chunk_count(split.samples, p0.m.shard->chunk_samples) || sums.channels() == 0)
            throw runtime_error("the parts' per-chunk sums cover " + std::to_string(rows) + " chunks of split '" +
                                split.name + "', which has " +
                                std::to_string(chunk_count(split.samples, p0.m.shard->chunk_samples)) +
                                " (a part's dataset.json edited?); re-run the parts");
        const double per_channel = static_cast<double>(split.field(whole.input_field).shape.numel() / sums.channels());
        return sums.stats(static_cast<double>(split.samples) * per_channel);
    }
    for (const Part& p : parts) {
        const bool same = p.m.stats.has_value() == p0.m.stats.has_value() &&
                          (!p.m.stats || (p.m.stats->mean == p0.m.stats->mean && p.m.stats->std == p0.m.stats->std));
        if (!same)
            throw usage_error(p.name() + " and " + p0.name() +
                              " carry different per-channel stats: they are not parts of one dataset");
    }
    return p0.m.stats;
}

// "train_x.npy" -> "train_x-00001-of-00003.npy"
std::string part_file_name(const std::string& file, std::uint64_t i, std::uint64_t n) {
    const fs::path f(file);
    char tag[64];
    std::snprintf(tag, sizeof tag, "-%05llu-of-%05llu", static_cast<unsigned long long>(i),
                  static_cast<unsigned long long>(n));
    return f.stem().string() + tag + f.extension().string();
}

// Files linked or moved into the staging directory; moves are undone unless
// the merge completes.
class Placer {
  public:
    Placer(AtomicDir& dir, bool move) : dir_(dir), move_(move) {}
    ~Placer() {
        if (done_) return;
        for (auto it = moved_.rbegin(); it != moved_.rend(); ++it)
            if (::rename(it->second.c_str(), it->first.c_str()) != 0)
                warning("could not move '" + it->second.string() + "' back to '" + it->first.string() +
                        "': " + std::strerror(errno) + "; move it back by hand");
    }
    void place(const fs::path& from, const std::string& name) {
        if (!move_) {
            const fs::path to = dir_.file(name); // a link: removing it on a signal loses nothing
            if (::link(from.c_str(), to.c_str()) == 0) return;
            const int err = errno;
            if (err == EXDEV)
                throw runtime_error("cannot hard-link '" + from.string() + "' into '" + dir_.final_path().string() +
                                    "' (they are on different filesystems, and --merge never copies samples); "
                                    "give an OUTPUT on the parts' filesystem");
            throw runtime_error(
                "cannot hard-link '" + from.string() + "' into '" + dir_.final_path().string() + "' (" +
                std::strerror(err) +
                "); give --move to rename the parts' files instead (on filesystems without hard links)");
        }
        const fs::path to = dir_.tmp_path() / name; // not registered: a signal must not delete moved samples
        if (::rename(from.c_str(), to.c_str()) != 0) {
            const int err = errno;
            throw runtime_error(
                "cannot move '" + from.string() + "' into '" + dir_.final_path().string() + "' (" + std::strerror(err) +
                ")" + (err == EXDEV ? "; give an OUTPUT on the parts' filesystem (--merge never copies)" : ""));
        }
        moved_.emplace_back(from, to);
    }
    void done() { done_ = true; }

  private:
    AtomicDir& dir_;
    bool move_, done_ = false;
    std::vector<std::pair<fs::path, fs::path>> moved_;
};

// The merged fields: one file where a single part holds samples, else parts.
Manifest place_parts(const std::vector<Part>& parts, Placer& placer) {
    const Part& p0 = parts.front();
    const std::uint64_t n = parts.size();
    Manifest whole = p0.m;
    whole.shard.reset();
    for (std::size_t s = 0; s < whole.splits.size(); ++s) {
        SplitInfo& split = whole.splits[s];
        split.samples = p0.m.shard->splits[s].total;
        for (std::size_t f = 0; f < split.fields.size(); ++f) {
            FieldInfo& field = split.fields[f];
            std::vector<std::size_t> holding;
            for (std::size_t k = 0; k < n; ++k)
                if (parts[k].m.splits[s].samples > 0) holding.push_back(k);
            if (holding.empty()) holding.push_back(0);
            field.bytes = 0;
            field.parts.clear();
            for (std::size_t k : holding) {
                const FieldInfo& src = parts[k].m.splits[s].fields[f];
                const std::string name = holding.size() == 1 ? src.file : part_file_name(src.file, k, n);
                placer.place(parts[k].dir / src.file, name);
                field.parts.push_back({name, parts[k].m.splits[s].samples, src.bytes, src.checksum});
                field.bytes += src.bytes;
            }
            if (field.parts.size() == 1) {
                field.file = field.parts.front().file;
                field.checksum = field.parts.front().checksum;
                field.parts.clear();
            } else {
                field.file.clear();
                field.checksum.clear();
            }
        }
    }
    return whole;
}

void describe_merge(const ConvertOptions& o, const std::vector<Part>& parts, Manifest& whole) {
    whole.stats = merged_stats(parts, whole);
    for (const Part& p : parts)
        if (p.m.num_classes && (!whole.num_classes || *p.m.num_classes > *whole.num_classes))
            whole.num_classes = p.m.num_classes; // dsconvert parts count the classes they saw
    whole.provenance.params["merged_parts"] = std::to_string(parts.size());
    whole.provenance.params["merged_by"] = o.command_line;
}

// --move leaves each part directory with its manifest only: remove both.
void remove_moved_parts(const std::vector<Part>& parts) {
    for (const Part& p : parts) {
        std::error_code ec;
        fs::remove(p.dir / manifest_file_name, ec);
        if (!fs::remove(p.dir, ec))
            warning("kept '" + p.dir.string() + "' (" + (ec ? ec.message() : "not empty") +
                    "): its dataset files are now in the merged dataset");
    }
}

void report_merge(const ConvertOptions& o, const std::vector<Part>& parts, const Manifest& whole) {
    std::uint64_t samples = 0, bytes = 0, files = 0;
    std::string splits;
    for (const auto& s : whole.splits) {
        samples += s.samples;
        splits += (splits.empty() ? "" : ", ") + s.name + " " + format_count(s.samples);
        for (const auto& f : s.fields) {
            bytes += f.bytes;
            files += std::max<std::size_t>(1, f.parts.size());
        }
    }
    const char* how = o.move ? "moved" : "hard-linked";
    if (o.out.json) {
        const nlohmann::json j = {{"tool", "dsconvert"},
                                  {"merged", o.output.string()},
                                  {"parts", parts.size()},
                                  {"samples", samples},
                                  {"bytes", bytes},
                                  {"files", files},
                                  {"method", o.move ? "move" : "link"}};
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    note(o.out, "dsconvert: merged " + std::to_string(parts.size()) + " parts (" + splits + " samples, " +
                    format_bytes(bytes) + " in " + std::to_string(files) + " files, " + how + ", nothing copied) -> " +
                    o.output.string());
}

} // namespace

void run_merge(const ConvertOptions& o) {
    check_merge_options(o);
    std::vector<Part> parts;
    for (const auto& dir : o.merge_parts) parts.push_back(load_part(dir));
    check_complete(parts);
    check_same_run(parts);
    check_files(parts);
    AtomicDir out(o.output, o.force);
    Manifest whole;
    {
        Placer placer(out, o.move);
        whole = place_parts(parts, placer);
        describe_merge(o, parts, whole);
        throw_if_interrupted();
        const std::string text = serialize_manifest(whole);
        (void)parse_manifest(text, "the merged manifest"); // its parts add up, checked before anything is renamed
        const fs::path path = out.file(manifest_file_name);
        const UniqueFd fd = UniqueFd::open(path, O_WRONLY | O_CREAT | O_TRUNC, "create");
        write_all(fd.get(), text.data(), text.size(), -1, path);
        out.commit();
        placer.done();
    }
    if (o.move) remove_moved_parts(parts);
    report_merge(o, parts, whole);
}

} // namespace dstk
