// dsconvert's settings: the options checked and resolved before any input
// is opened, so that a usage error never leaves anything behind.
#include "convert_job.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "dstk/chunked_file.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"

namespace dstk {
namespace {

int parse_compress(const std::string& text, bool& zstd) {
    if (text == "none") {
        zstd = false;
        return 0;
    }
    zstd = true;
    if (text == "zstd") return chunked_default_level;
    if (text.rfind("zstd:", 0) == 0) {
        const std::string lv = text.substr(5);
        char* end = nullptr;
        const long v = std::strtol(lv.c_str(), &end, 10);
        if (!lv.empty() && *end == 0 && v >= zstd_min_level() && v <= zstd_max_level() && v != 0)
            return static_cast<int>(v);
        throw usage_error("invalid --compress level '" + lv + "' (zstd levels are " + std::to_string(zstd_min_level()) +
                          ".." + std::to_string(zstd_max_level()) + ", not 0); e.g. --compress zstd:3");
    }
    throw usage_error("invalid --compress '" + text + "' (expected none, zstd or zstd:LEVEL)");
}

double parse_number(const std::string& s, const std::string& what) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != 0 || !std::isfinite(v))
        throw usage_error("invalid " + what + " '" + s + "' (not a number)");
    return v;
}

// A split or field name given in an option (`flag`), refused as a usage
// error where it could not be a file name of the output (name_problem).
void check_option_name(const std::string& flag, std::string_view what, std::string_view name, const char* example) {
    if (const std::string why = name_problem(what, name); !why.empty())
        throw usage_error("invalid " + flag + ": " + why + "; give a plain name, e.g. " + example);
}

constexpr EnumNames<OutputFormat, 3> output_format_names{
    {{{OutputFormat::dataset, "dataset"}, {OutputFormat::npy, "npy"}, {OutputFormat::raw, "raw"}}}};

} // namespace

OutputFormat parse_output_format(std::string_view text) {
    return output_format_names.parse(text, "--to");
}

std::string_view output_format_name(OutputFormat f) {
    return output_format_names.name(f);
}

std::vector<SplitFraction> parse_split_fractions(const std::string& text) {
    std::vector<SplitFraction> out;
    std::stringstream ss(text);
    std::string item;
    double sum = 0;
    while (std::getline(ss, item, ',')) {
        const auto eq = item.find('=');
        if (eq == std::string::npos || eq == 0)
            throw usage_error("invalid --split item '" + item + "' (expected NAME=FRACTION, e.g. train=0.9,test=0.1)");
        SplitFraction f{item.substr(0, eq), parse_number(item.substr(eq + 1), "--split fraction")};
        check_option_name("--split", "split", f.name, "--split train=0.9,test=0.1");
        if (!(f.fraction > 0) || f.fraction > 1)
            throw usage_error("invalid --split fraction for '" + f.name + "' (must be in (0, 1])");
        for (const auto& g : out)
            if (g.name == f.name) throw usage_error("--split names '" + f.name + "' twice");
        sum += f.fraction;
        out.push_back(f);
    }
    if (out.empty()) throw usage_error("empty --split (expected e.g. train=0.9,test=0.1)");
    if (std::fabs(sum - 1.0) > 1e-6)
        throw usage_error("--split fractions sum to " + std::to_string(sum) + " (they must sum to 1)");
    return out;
}

void parse_dtype_options(const std::vector<std::string>& texts, ConvertOptions& o) {
    for (const std::string& t : texts) {
        const auto eq = t.find('=');
        if (eq == std::string::npos) {
            if (o.dtype)
                throw usage_error("--dtype " + t +
                                  ": a bare DTYPE is the input field's, and one was given already; "
                                  "give other fields as FIELD=DTYPE (e.g. --dtype robs=bf16)");
            o.dtype = parse_dtype(t, "--dtype");
            continue;
        }
        const std::string field = t.substr(0, eq);
        if (field.empty())
            throw usage_error("invalid --dtype '" + t + "' (expected DTYPE or FIELD=DTYPE, e.g. --dtype robs=bf16)");
        check_option_name("--dtype", "field", field, "--dtype robs=bf16");
        for (const auto& [name, dtype] : o.field_dtypes)
            if (name == field) throw usage_error("--dtype names field '" + field + "' twice");
        o.field_dtypes.emplace_back(field, parse_dtype(t.substr(eq + 1), "--dtype " + field));
    }
}

namespace convert {
namespace {

namespace fs = std::filesystem;

// An absolute path with symlinks in its existing part resolved and no
// trailing '/', to compare where two paths lead.
fs::path resolved(const fs::path& p) {
    std::error_code ec;
    fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
    if (ec) r = fs::absolute(p).lexically_normal();
    return r.has_filename() ? r : r.parent_path();
}

// The report is a side file put in place beside OUTPUT: at OUTPUT's own
// name it would take the output's place, and inside OUTPUT it would go
// where the output is replaced whole. Refused before any work.
void check_report_path(const ConvertOptions& o) {
    if (o.report_json.empty() || o.output.empty() || o.output == "-") return;
    const fs::path out = resolved(o.output), report = resolved(o.report_json);
    const auto [o_end, r_end] = std::mismatch(out.begin(), out.end(), report.begin(), report.end());
    if (o_end != out.end()) return;
    throw usage_error("--report-json '" + o.report_json.string() + "' is " +
                      (r_end == report.end() ? "OUTPUT itself" : "inside OUTPUT '" + o.output.string() + "'") +
                      " (the report is written beside the output, not in it); give a path outside OUTPUT, e.g. "
                      "--report-json " +
                      out.string() + ".report.json");
}

} // namespace

void check_modes(const ConvertOptions& o) {
    const bool merge = !o.merge_parts.empty(), concat = !o.concat_members.empty();
    if (o.move && !merge && !concat)
        throw usage_error("--move goes with --merge or --concat (it moves the inputs' files into OUTPUT)");
    if (o.dataset_field && !concat) throw usage_error("--dataset-field goes with --concat (it numbers the members)");
    if (o.input.empty() && !o.benchmark && !merge && !concat)
        throw usage_error("no INPUT given (dsconvert INPUT OUTPUT; see --help)");
    if (o.benchmark && !o.output.empty()) throw usage_error("--benchmark writes nothing; drop OUTPUT");
    if (o.verify_only && !o.output.empty())
        throw usage_error("--verify checks one dataset and writes nothing; drop OUTPUT");
    check_report_path(o);
}

namespace {

// The names that --select, --input and --label give: fields and splits of
// the input, so never a name that could not be a file name.
void check_field_names(const ConvertOptions& o) {
    if (!o.select.empty()) {
        const auto slash = o.select.find('/');
        check_option_name("--select", "split", o.select.substr(0, slash), "--select test/x");
        if (slash != std::string::npos)
            check_option_name("--select", "field", o.select.substr(slash + 1), "--select test/x");
    }
    if (!o.raw.input.empty()) check_option_name("--input", "field", o.raw.input, "--input x");
    if (!o.raw.label.empty()) check_option_name("--label", "field", o.raw.label, "--label y");
}

} // namespace

Settings check_settings(const ConvertOptions& o) {
    if (o.output.empty()) throw usage_error("no output given (dsconvert INPUT OUTPUT, or dsconvert --verify DIR)");
    for (const auto& [value, name] : {std::pair{o.scale, "--scale"}, std::pair{o.offset, "--offset"}})
        if (value && !std::isfinite(*value))
            throw usage_error("invalid " + std::string(name) + " " + std::to_string(*value) +
                              " (the mapping must be finite: a non-finite " + name +
                              " turns every value into NaN or Inf); give a finite number");
    if (o.output == "-" && (!o.to || *o.to == OutputFormat::dataset))
        throw usage_error("OUTPUT '-' is stdout, which holds one array: give --to npy or --to raw (a dataset is a "
                          "directory)");
    if (o.output == "-" && o.out.json)
        throw usage_error("--json prints on stdout, which OUTPUT '-' already uses; drop one (--report-json FILE "
                          "writes the report elsewhere)");
    if (o.num_classes && *o.num_classes < 2)
        throw usage_error("invalid --num-classes " + std::to_string(*o.num_classes) + " (at least 2)");
    Settings s;
    if (!o.split.empty()) s.split = parse_split_fractions(o.split);
    check_field_names(o);
    s.level = parse_compress(o.compress, s.zstd);
    s.to = o.to.value_or(OutputFormat::dataset);
    if (!o.to && o.output.extension() == ".npy") s.to = OutputFormat::npy;
    if (s.to != OutputFormat::dataset && s.zstd)
        throw usage_error("--compress zstd writes a dataset directory; a single " +
                          std::string(s.to == OutputFormat::npy ? ".npy" : "raw") + " output is uncompressed");
    if (s.to != OutputFormat::raw && o.out_layout == Layout::feature_major)
        throw usage_error("--out-layout feature-major is for raw outputs (--to raw); datasets are sample-major");
    s.range_auto = o.range == "auto";
    if (!o.range.empty() && !s.range_auto) {
        const auto colon = o.range.find(':', 1);
        if (colon == std::string::npos) throw usage_error("invalid --range '" + o.range + "' (expected auto or LO:HI)");
        s.range_given = {parse_number(o.range.substr(0, colon), "--range LO"),
                         parse_number(o.range.substr(colon + 1), "--range HI")};
        if (!(s.range_given->second > s.range_given->first))
            throw usage_error("invalid --range '" + o.range + "' (HI must be greater than LO)");
    }
    if (!o.range.empty() && (o.scale || o.offset))
        throw usage_error("--range and --scale/--offset both set the mapping; give one of them");
    return s;
}

} // namespace convert
} // namespace dstk
