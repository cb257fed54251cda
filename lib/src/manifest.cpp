#include "dstk/manifest.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <set>

#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"
#include "dstk/units.hpp"

using nlohmann::json;

namespace dstk {

namespace {

constexpr EnumNames<Storage, 2> storage_names{{{{Storage::npy, "npy"}, {Storage::zstd_chunked, "zstd-chunked"}}}};

// Reading walks the document with a path for messages: "splits[0].fields[1].dtype".
class Reader {
  public:
    Reader(const std::string& source) : source_(source) {}

    [[noreturn]] void fail(const std::string& path, const std::string& why) const {
        throw runtime_error(source_ + ": " + (path.empty() ? "" : path + ": ") + why +
                            "; fix or regenerate the manifest (dsgen or dsconvert write it)");
    }
    const json& member(const json& obj, const std::string& path, const char* key) const {
        if (!obj.is_object()) fail(path, "expected an object");
        auto it = obj.find(key);
        if (it == obj.end()) fail(path, std::string("missing \"") + key + "\"");
        return *it;
    }
    std::string string(const json& obj, const std::string& path, const char* key) const {
        const json& v = member(obj, path, key);
        if (!v.is_string()) fail(join(path, key), "expected a string");
        return v.get<std::string>();
    }
    std::uint64_t uint(const json& obj, const std::string& path, const char* key) const {
        const json& v = member(obj, path, key);
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
            fail(join(path, key), "expected a non-negative integer");
        return v.get<std::uint64_t>();
    }
    static std::string join(const std::string& path, const std::string& key) {
        return path.empty() ? key : path + "." + key;
    }

  private:
    std::string source_;
};

Shape parse_dims(const Reader& r, const json& v, const std::string& path) {
    if (!v.is_array()) r.fail(path, "expected an array of dimensions");
    Shape s;
    for (const auto& d : v) {
        if (!d.is_number_unsigned() || d.get<std::uint64_t>() == 0)
            r.fail(path, "dimensions must be positive integers");
        s.dims.push_back(d.get<std::uint64_t>());
    }
    if (s.dims.size() > 8) r.fail(path, "more than 8 dimensions");
    try {
        (void)s.numel();
    } catch (const Error&) {
        r.fail(path, "shape " + s.str() + " overflows 64 bits");
    }
    return s;
}

std::vector<double> parse_doubles(const Reader& r, const json& v, const std::string& path) {
    if (!v.is_array()) r.fail(path, "expected an array of numbers");
    std::vector<double> out;
    for (const auto& d : v) {
        if (!d.is_number()) r.fail(path, "expected numbers");
        out.push_back(d.get<double>());
    }
    return out;
}

Manifest manifest_from_json(const Reader& r, const json& doc);

std::string format_number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// Statistics normalise the input ((x - mean) / std): a std that is 0,
// negative or not finite would blow the input up (or make it NaN) and train
// to nonsense without a word, so such a manifest is refused.
void check_usable_stats(const Reader& r, const ChannelStats& cs, const std::string& path) {
    for (std::size_t c = 0; c < cs.std.size(); ++c) {
        const std::string at = path + ".std[" + std::to_string(c) + "]";
        if (!std::isfinite(cs.mean[c]))
            r.fail(path + ".mean[" + std::to_string(c) + "]",
                   "not a finite number (the data holds NaN or Inf?); remove \"stats\" so that dstrain computes "
                   "them from the data, or re-create the dataset from finite values");
        if (!std::isfinite(cs.std[c]) || !(cs.std[c] > 0))
            r.fail(at, format_number(cs.std[c]) + " cannot normalise channel " + std::to_string(c) +
                           " (the input is divided by it: a std must be positive and finite); remove \"stats\" so "
                           "that dstrain computes them from the data, or write the channel's real std");
    }
}

// A field's "stats": one finite mean and one positive, finite std per channel
// of its shape (stats_channels), so that a reader can normalise with them
// without checking again.
ChannelStats parse_field_stats(const Reader& r, const json& v, const std::string& path, const Shape& shape) {
    ChannelStats cs;
    cs.mean = parse_doubles(r, r.member(v, path, "mean"), path + ".mean");
    cs.std = parse_doubles(r, r.member(v, path, "std"), path + ".std");
    const std::uint64_t channels = stats_channels(shape);
    if (cs.mean.size() != channels || cs.std.size() != channels)
        r.fail(path, "expected " + std::to_string(channels) + " channels for shape " + shape.str() + ", got " +
                         std::to_string(cs.mean.size()) + " means and " + std::to_string(cs.std.size()) + " stds");
    check_usable_stats(r, cs, path);
    return cs;
}

std::string plain_file_name(const Reader& r, const json& obj, const std::string& path) {
    std::string file = r.string(obj, path, "file");
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        r.fail(path + ".file", "must be a plain file name inside the dataset directory");
    return file;
}

// "parts": a field stored in several files (dsconvert --merge); their samples
// add up to the split's and their bytes to the field's.
std::vector<FieldPart> parse_parts(const Reader& r, const json& v, const std::string& path, const FieldInfo& f,
                                   std::uint64_t split_samples) {
    if (!v.is_array() || v.empty()) r.fail(path, "expected a non-empty array of parts");
    std::vector<FieldPart> parts;
    std::set<std::string> files;
    std::uint64_t samples = 0, bytes = 0;
    for (std::size_t k = 0; k < v.size(); ++k) {
        const std::string pp = path + "[" + std::to_string(k) + "]";
        FieldPart part;
        part.file = plain_file_name(r, v[k], pp);
        if (!files.insert(part.file).second) r.fail(pp + ".file", "names the same file as an earlier part");
        part.samples = r.uint(v[k], pp, "samples");
        part.bytes = r.uint(v[k], pp, "bytes");
        if (v[k].contains("checksum")) part.checksum = r.string(v[k], pp, "checksum");
        if (part.samples > ~samples || part.bytes > ~bytes) r.fail(pp, "sample or byte count overflows 64 bits");
        samples += part.samples;
        bytes += part.bytes;
        parts.push_back(std::move(part));
    }
    if (samples != split_samples)
        r.fail(path, "the parts hold " + std::to_string(samples) + " samples, the split " +
                         std::to_string(split_samples) + " (a part missing or extra?)");
    if (bytes != f.bytes)
        r.fail(path, "the parts hold " + std::to_string(bytes) + " bytes, the field says " + std::to_string(f.bytes));
    return parts;
}

FieldInfo parse_field(const Reader& r, const json& fj, const std::string& fp, std::uint64_t split_samples) {
    FieldInfo f;
    f.name = r.string(fj, fp, "name");
    if (const std::string why = name_problem("field", f.name); !why.empty()) r.fail(fp + ".name", why);
    const std::string dt = r.string(fj, fp, "dtype");
    const auto dtype = dtype_from_name(dt);
    if (!dtype) r.fail(fp + ".dtype", "unknown dtype '" + dt + "'");
    f.dtype = *dtype;
    f.shape = parse_dims(r, r.member(fj, fp, "shape"), fp + ".shape");
    const std::string storage = r.string(fj, fp, "storage");
    if (const auto s = storage_names.find(storage))
        f.storage = *s;
    else
        r.fail(fp + ".storage", "unknown storage '" + storage + "' (expected " + storage_names.choices() + ")");
    const bool in_parts = fj.is_object() && fj.contains("parts");
    if (in_parts && fj.contains("file")) r.fail(fp, "has both \"file\" and \"parts\" (a field is one or the other)");
    if (!in_parts) f.file = plain_file_name(r, fj, fp);
    f.bytes = r.uint(fj, fp, "bytes");
    if (fj.contains("checksum")) f.checksum = r.string(fj, fp, "checksum");
    if (fj.contains("chunk_samples")) f.chunk_samples = r.uint(fj, fp, "chunk_samples");
    if (f.storage == Storage::zstd_chunked && f.chunk_samples == 0)
        r.fail(fp + ".chunk_samples", "zstd-chunked storage needs a positive chunk_samples");
    try {
        (void)checked_sample_total(f, split_samples);
    } catch (const Error&) {
        r.fail(fp, "samples x sample size overflows 64 bits");
    }
    if (in_parts) f.parts = parse_parts(r, fj["parts"], fp + ".parts", f, split_samples);
    if (fj.contains("stats")) f.stats = parse_field_stats(r, fj["stats"], fp + ".stats", f.shape);
    return f;
}

// "field_chunk_sums": {"FIELD": [[row], ...], ...}.
std::map<std::string, std::vector<std::vector<double>>> parse_field_chunk_sums(const Reader& r, const json& v,
                                                                               const std::string& path) {
    if (!v.is_object()) r.fail(path, "expected an object of fields' rows");
    std::map<std::string, std::vector<std::vector<double>>> out;
    for (auto it = v.begin(); it != v.end(); ++it) {
        const std::string fp = path + "." + it.key();
        if (!it->is_array()) r.fail(fp, "expected an array of arrays of numbers");
        auto& rows = out[it.key()];
        for (const auto& row : *it) rows.push_back(parse_doubles(r, row, fp));
    }
    return out;
}

// "shard": what part of a whole a --shard output holds (ShardInfo).
ShardInfo parse_shard(const Reader& r, const json& v, const Manifest& m) {
    ShardInfo sh;
    sh.count = r.uint(v, "shard", "count");
    sh.index = r.uint(v, "shard", "index");
    if (sh.count == 0 || sh.index >= sh.count) r.fail("shard", "index must be below count (0-based)");
    sh.chunk_samples = r.uint(v, "shard", "chunk_samples");
    if (sh.chunk_samples == 0) r.fail("shard.chunk_samples", "must be positive");
    sh.settings = r.string(v, "shard", "settings");
    const json& splits = r.member(v, "shard", "splits");
    if (!splits.is_array() || splits.size() != m.splits.size())
        r.fail("shard.splits", "expected one entry per split of the manifest");
    for (std::size_t i = 0; i < splits.size(); ++i) {
        const std::string sp = "shard.splits[" + std::to_string(i) + "]";
        ShardSplit s;
        s.name = r.string(splits[i], sp, "name");
        if (s.name != m.splits[i].name) r.fail(sp + ".name", "expected '" + m.splits[i].name + "' (the splits' order)");
        s.first = r.uint(splits[i], sp, "first");
        s.total = r.uint(splits[i], sp, "total");
        if (s.first > s.total || m.splits[i].samples > s.total - s.first)
            r.fail(sp, "the range [first, first + samples) ends after the whole split's total");
        if (splits[i].contains("chunk_sums")) {
            const json& cs = splits[i]["chunk_sums"];
            if (!cs.is_array()) r.fail(sp + ".chunk_sums", "expected an array of arrays of numbers");
            for (const auto& row : cs) s.chunk_sums.push_back(parse_doubles(r, row, sp + ".chunk_sums"));
        }
        if (splits[i].contains("field_chunk_sums"))
            s.field_chunk_sums = parse_field_chunk_sums(r, splits[i]["field_chunk_sums"], sp + ".field_chunk_sums");
        sh.splits.push_back(std::move(s));
    }
    return sh;
}

} // namespace

std::string name_problem(std::string_view what, std::string_view name) {
    std::string shown;
    for (const char c : name) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u != 0x7f) {
            shown += c;
            continue;
        }
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", u);
        shown += buf;
    }
    auto bad = [&](const std::string& why) {
        return std::string(what) + " name '" + shown + "' " + why +
               " (names become file names in the dataset directory)";
    };
    if (name.empty()) return std::string(what) + " name is empty (names become file names in the dataset directory)";
    if (name == "." || name == "..") return bad("is a directory name");
    if (name.size() > max_name_bytes)
        return bad("is " + std::to_string(name.size()) + " bytes long, more than " + std::to_string(max_name_bytes));
    if (name.find('/') != std::string_view::npos) return bad("holds a '/'");
    if (shown.size() != name.size()) return bad("holds a control character");
    return "";
}

std::string field_file_name(std::string_view split, std::string_view field, std::string_view ext) {
    for (const auto& problem : {name_problem("split", split), name_problem("field", field)})
        if (!problem.empty()) throw runtime_error("internal: " + problem + " reached the writer unchecked");
    return std::string(split) + "_" + std::string(field) + std::string(ext);
}

std::string_view storage_name(Storage s) {
    return storage_names.name(s);
}

const FieldInfo* SplitInfo::find(std::string_view f) const {
    for (const auto& field : fields)
        if (field.name == f) return &field;
    return nullptr;
}

const FieldInfo& SplitInfo::field(std::string_view f) const {
    if (const auto* p = find(f)) return *p;
    std::string have;
    for (const auto& field : fields) have += (have.empty() ? "" : ", ") + field.name;
    if (f.empty()) // a role (input_field, label_field) that the dataset does not give
        throw usage_error("split '" + name +
                          "': no field has the role asked for (the dataset names no input or "
                          "label field; it has: " +
                          have + "); name the field, or set the roles with dsconvert");
    throw runtime_error("split '" + name + "' has no field '" + std::string(f) + "' (it has: " + have + ")");
}

const SplitInfo* Manifest::find(std::string_view s) const {
    for (const auto& split : splits)
        if (split.name == s) return &split;
    return nullptr;
}

const SplitInfo& Manifest::split(std::string_view s) const {
    if (const auto* p = find(s)) return *p;
    std::string have;
    for (const auto& split : splits) have += (have.empty() ? "" : ", ") + split.name;
    throw runtime_error("dataset has no split '" + std::string(s) + "' (it has: " + have + ")");
}

const ChannelStats* Manifest::stats_of(std::string_view field) const {
    const SplitInfo* train = find("train");
    if (!train && !splits.empty()) train = &splits.front();
    if (const FieldInfo* f = train ? train->find(field) : nullptr; f && f->stats) return &*f->stats;
    if (stats && !field.empty() && field == input_field) return &*stats;
    return nullptr;
}

// As dstrain's models read a sample (train::tensor_shape_from): D is D
// channels of 1x1, HxW one channel, CxHxW C channels.
std::uint64_t stats_channels(const Shape& s) {
    const std::size_t rank = s.dims.size();
    return rank == 1 || rank >= 3 ? s.dims[0] : 1;
}

Manifest parse_manifest(std::string_view text, const std::string& source) {
    const Reader r(source);
    json doc;
    try {
        doc = parse_json(text);
    } catch (const json::exception& e) { // parse_error, and out_of_range for numbers like 1e9999
        r.fail("", std::string("not valid JSON (") + e.what() + ")");
    }
    try {
        return manifest_from_json(r, doc);
    } catch (const json::exception& e) { // a value of a type the checks above did not expect
        r.fail("", std::string("unexpected value (") + e.what() + ")");
    }
}

namespace {

// A manifest never names a field that a split lacks: dstrain would otherwise
// fail late ("split 'train' has no field 'x'") on a dataset --verify called OK.
// A label field only defaulted to "y" is dropped where no split has one.
// An empty role names no field; a role only defaulted ("x", "y") is dropped
// where no split has such a field.
template <typename Fail> void check_role(Manifest& m, std::string& role, const char* key, bool named, Fail fail) {
    if (role.empty()) return;
    bool any = false;
    for (const auto& split : m.splits) any |= split.find(role) != nullptr;
    if (!any && !named) {
        role.clear();
        return;
    }
    for (const auto& split : m.splits)
        if (!split.find(role))
            fail(key, "names field '" + role + "', which split '" + split.name +
                          "' does not have (re-create the dataset with dsconvert)");
}

template <typename Fail> void check_named_fields(Manifest& m, Fail fail, bool input_named, bool label_named) {
    check_role(m, m.input_field, "input_field", input_named, fail);
    check_role(m, m.label_field, "label_field", label_named, fail);
}

Manifest manifest_from_json(const Reader& r, const json& doc) {
    if (!doc.is_object()) r.fail("", "expected a JSON object at the top level");
    Manifest m;
    m.format_version = static_cast<int>(r.uint(doc, "", "format_version"));
    if (m.format_version != manifest_format_version)
        r.fail("format_version", "version " + std::to_string(m.format_version) + " is not supported (this dstk reads " +
                                     std::to_string(manifest_format_version) + "); upgrade dstk");
    if (doc.contains("num_classes")) {
        const auto n = r.uint(doc, "", "num_classes");
        if (n == 0 || n > 1'000'000) r.fail("num_classes", "must be between 1 and 1000000");
        m.num_classes = static_cast<std::uint32_t>(n);
    }
    if (doc.contains("input_field")) m.input_field = r.string(doc, "", "input_field");
    if (doc.contains("label_field")) m.label_field = r.string(doc, "", "label_field");

    const json& splits = r.member(doc, "", "splits");
    if (!splits.is_array() || splits.empty()) r.fail("splits", "expected a non-empty array");
    std::set<std::string> split_names;
    for (std::size_t i = 0; i < splits.size(); ++i) {
        const std::string sp = "splits[" + std::to_string(i) + "]";
        SplitInfo split;
        split.name = r.string(splits[i], sp, "name");
        if (const std::string why = name_problem("split", split.name); !why.empty()) r.fail(sp + ".name", why);
        if (!split_names.insert(split.name).second) r.fail(sp + ".name", "split names must be unique");
        split.samples = r.uint(splits[i], sp, "samples");
        const json& fields = r.member(splits[i], sp, "fields");
        if (!fields.is_array() || fields.empty()) r.fail(sp + ".fields", "expected a non-empty array");
        std::set<std::string> field_names;
        for (std::size_t j = 0; j < fields.size(); ++j) {
            const std::string fp = sp + ".fields[" + std::to_string(j) + "]";
            FieldInfo f = parse_field(r, fields[j], fp, split.samples);
            if (!field_names.insert(f.name).second) r.fail(fp + ".name", "field names must be unique within a split");
            split.fields.push_back(std::move(f));
        }
        m.splits.push_back(std::move(split));
    }
    check_named_fields(
        m, [&](const std::string& key, const std::string& why) { r.fail(key, why); }, doc.contains("input_field"),
        doc.contains("label_field"));
    if (doc.contains("stats")) {
        const json& st = doc["stats"];
        ChannelStats cs;
        cs.mean = parse_doubles(r, r.member(st, "stats", "mean"), "stats.mean");
        cs.std = parse_doubles(r, r.member(st, "stats", "std"), "stats.std");
        if (cs.mean.size() != cs.std.size() || cs.mean.empty())
            r.fail("stats", "mean and std must have the same, non-zero, number of channels");
        check_usable_stats(r, cs, "stats");
        m.stats = std::move(cs);
    }
    if (doc.contains("shard")) m.shard = parse_shard(r, doc["shard"], m);
    if (doc.contains("provenance")) {
        const json& p = doc["provenance"];
        if (!p.is_object()) r.fail("provenance", "expected an object");
        auto str = [&](const char* k) { return p.contains(k) && p[k].is_string() ? p[k].get<std::string>() : ""; };
        m.provenance.tool = str("tool");
        m.provenance.version = str("version");
        m.provenance.command_line = str("command_line");
        m.provenance.created = str("created");
        if (p.contains("seed") && p["seed"].is_number_unsigned()) m.provenance.seed = p["seed"].get<std::uint64_t>();
        if (p.contains("params") && p["params"].is_object())
            for (auto it = p["params"].begin(); it != p["params"].end(); ++it)
                m.provenance.params[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
    }
    return m;
}

} // namespace

bool usable_stats(const ChannelStats& s) {
    for (const double m : s.mean)
        if (!std::isfinite(m)) return false;
    for (const double d : s.std)
        if (!std::isfinite(d) || !(d > 0)) return false;
    return true;
}

std::string field_type_text(DType t, const Shape& s) {
    std::string out(dtype_name(t));
    if (s.dims.empty()) return out;
    out += '[';
    out += s.str();
    out += ']';
    return out;
}

std::uint64_t checked_sample_total(const FieldInfo& f, std::uint64_t samples) {
    return checked_mul(f.sample_bytes(), samples, "field '" + f.name + "' size");
}

namespace {

json shard_json(const ShardInfo& sh) {
    json j = {{"index", sh.index},
              {"count", sh.count},
              {"chunk_samples", sh.chunk_samples},
              {"settings", sh.settings},
              {"splits", json::array()}};
    for (const auto& s : sh.splits) {
        json sj = {{"name", s.name}, {"first", s.first}, {"total", s.total}};
        if (!s.chunk_sums.empty()) sj["chunk_sums"] = s.chunk_sums;
        if (!s.field_chunk_sums.empty()) sj["field_chunk_sums"] = s.field_chunk_sums;
        j["splits"].push_back(std::move(sj));
    }
    return j;
}

} // namespace

std::string serialize_manifest(const Manifest& m) {
    Manifest checked = m;
    check_named_fields(
        checked,
        [](const std::string& key, const std::string& why) {
            throw runtime_error("internal: the manifest's " + key + " " + why);
        },
        true, false);
    json doc;
    doc["format_version"] = m.format_version;
    if (m.num_classes) doc["num_classes"] = *m.num_classes;
    doc["input_field"] = checked.input_field;
    doc["label_field"] = checked.label_field;
    doc["splits"] = json::array();
    for (const auto& s : m.splits) {
        json sj;
        sj["name"] = s.name;
        sj["samples"] = s.samples;
        sj["fields"] = json::array();
        for (const auto& f : s.fields) {
            json fj;
            fj["name"] = f.name;
            fj["dtype"] = std::string(dtype_name(f.dtype));
            fj["shape"] = f.shape.dims;
            fj["storage"] = std::string(storage_name(f.storage));
            if (f.parts.empty()) fj["file"] = f.file;
            fj["bytes"] = f.bytes;
            if (!f.checksum.empty() && f.parts.empty()) fj["checksum"] = f.checksum;
            if (f.storage == Storage::zstd_chunked) fj["chunk_samples"] = f.chunk_samples;
            for (const auto& part : f.parts) {
                json pj = {{"file", part.file}, {"samples", part.samples}, {"bytes", part.bytes}};
                if (!part.checksum.empty()) pj["checksum"] = part.checksum;
                fj["parts"].push_back(std::move(pj));
            }
            if (f.stats && usable_stats(*f.stats)) fj["stats"] = {{"mean", f.stats->mean}, {"std", f.stats->std}};
            sj["fields"].push_back(std::move(fj));
        }
        doc["splits"].push_back(std::move(sj));
    }
    if (m.stats && usable_stats(*m.stats)) doc["stats"] = {{"mean", m.stats->mean}, {"std", m.stats->std}};
    if (m.shard) doc["shard"] = shard_json(*m.shard);
    json p;
    p["tool"] = m.provenance.tool;
    p["version"] = m.provenance.version;
    p["command_line"] = m.provenance.command_line;
    p["created"] = m.provenance.created;
    if (m.provenance.seed) p["seed"] = *m.provenance.seed;
    p["params"] = json::object();
    for (const auto& [k, v] : m.provenance.params) p["params"][k] = v;
    doc["provenance"] = std::move(p);
    return dump_json(doc, 2, "the manifest") + "\n";
}

Manifest load_manifest(const std::filesystem::path& dir) {
    const auto path = dir / manifest_file_name;
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
        throw runtime_error("'" + dir.string() +
                            "' is not a dataset directory (no such directory); create one with dsgen or dsconvert");
    if (!std::filesystem::exists(path, ec))
        throw runtime_error("'" + dir.string() + "' is not a dataset directory (no " + manifest_file_name +
                            "); create one with dsgen or dsconvert");
    return parse_manifest(read_input_file(path, "manifest", 64u << 20), path.string());
}

std::string now_iso8601() {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

} // namespace dstk
