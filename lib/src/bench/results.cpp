#include "dstk/bench/results.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"

namespace dstk::bench {
namespace {

using nlohmann::json;

constexpr EnumNames<CaseStatus, 3> status_names{
    {{{CaseStatus::ok, "ok"}, {CaseStatus::waived, "waived"}, {CaseStatus::failed, "failed"}}}};

const json& member(const json& o, const char* name, const std::string& where) {
    if (!o.is_object()) throw std::invalid_argument((where.empty() ? "the document" : where) + " is not an object");
    auto it = o.find(name);
    if (it == o.end()) throw std::invalid_argument((where.empty() ? "" : where + ".") + name + " is missing");
    return *it;
}

std::string get_string(const json& o, const char* name, const std::string& where, bool required = false) {
    if (!o.contains(name)) {
        if (required) member(o, name, where); // throws "missing"
        return {};
    }
    const json& v = o.at(name);
    if (v.is_null()) return {};
    if (!v.is_string()) throw std::invalid_argument(where + "." + name + " is not a string");
    return v.get<std::string>();
}

double get_number(const json& o, const char* name, const std::string& where, bool required = false) {
    if (!o.contains(name) || o.at(name).is_null()) {
        if (required) throw std::invalid_argument(where + "." + name + " is missing");
        return 0;
    }
    const json& v = o.at(name);
    if (!v.is_number()) throw std::invalid_argument(where + "." + name + " is not a number");
    return v.get<double>();
}

std::uint64_t get_u64(const json& o, const char* name, const std::string& where) {
    if (!o.contains(name) || o.at(name).is_null()) return 0;
    const json& v = o.at(name);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<long long>() >= 0))
        throw std::invalid_argument(where + "." + name + " is not a non-negative integer");
    return v.get<std::uint64_t>();
}

int get_int(const json& o, const char* name, const std::string& where) {
    if (!o.contains(name) || o.at(name).is_null()) return 0;
    const json& v = o.at(name);
    if (!v.is_number_integer()) throw std::invalid_argument(where + "." + name + " is not an integer");
    const long long x = v.get<long long>();
    if (x < -1000000 || x > 1000000) throw std::invalid_argument(where + "." + name + " is out of range");
    return static_cast<int>(x);
}

// One table per member type drives both directions, so a field added to
// Context is written and read alike.
template <class T> struct Field {
    const char* name;
    T Context::*member;
};
constexpr Field<std::string> string_fields[] = {{"dstk_version", &Context::dstk_version},
                                                {"command_line", &Context::command_line},
                                                {"date", &Context::date},
                                                {"host", &Context::host},
                                                {"kernel", &Context::kernel},
                                                {"cpu_model", &Context::cpu_model},
                                                {"target", &Context::target},
                                                {"file", &Context::file},
                                                {"filesystem", &Context::filesystem},
                                                {"mount_point", &Context::mount_point},
                                                {"block_device", &Context::block_device},
                                                {"gpu_status", &Context::gpu_status},
                                                {"driver_version", &Context::driver_version},
                                                {"cuda_runtime_version", &Context::cuda_runtime_version},
                                                {"cudnn_version", &Context::cudnn_version}};
constexpr Field<std::uint64_t> u64_fields[] = {{"ram_total_bytes", &Context::ram_total_bytes},
                                               {"ram_available_bytes", &Context::ram_available_bytes},
                                               {"file_bytes", &Context::file_bytes},
                                               {"sample_bytes", &Context::sample_bytes}};
constexpr Field<unsigned> count_fields[] = {{"logical_cores", &Context::logical_cores},
                                            {"physical_cores", &Context::physical_cores},
                                            {"numa_nodes", &Context::numa_nodes}};

json context_to_json(const Context& c) {
    json j = json::object();
    for (const auto& f : string_fields) j[f.name] = c.*f.member;
    for (const auto& f : u64_fields) j[f.name] = c.*f.member;
    for (const auto& f : count_fields) j[f.name] = c.*f.member;
    j["built_with_cuda"] = c.built_with_cuda;
    j["gpu"] = nullptr;
    if (!c.gpu_name.empty())
        j["gpu"] = {{"name", c.gpu_name},
                    {"memory_bytes", c.gpu_memory_bytes},
                    {"free_bytes", c.gpu_free_bytes},
                    {"pcie_generation", c.pcie_generation},
                    {"pcie_width", c.pcie_width}};
    j["settings"] = c.settings.is_object() ? c.settings : json::object();
    return j;
}

Context context_from_json(const json& j) {
    const std::string w = "context";
    member(j, "dstk_version", w);
    Context c;
    for (const auto& f : string_fields) c.*f.member = get_string(j, f.name, w);
    for (const auto& f : u64_fields) c.*f.member = get_u64(j, f.name, w);
    for (const auto& f : count_fields) c.*f.member = static_cast<unsigned>(get_int(j, f.name, w));
    if (j.contains("built_with_cuda")) {
        if (!j["built_with_cuda"].is_boolean()) throw std::invalid_argument("context.built_with_cuda is not a boolean");
        c.built_with_cuda = j["built_with_cuda"].get<bool>();
    }
    if (j.contains("gpu") && !j["gpu"].is_null()) {
        const json& g = j["gpu"];
        const std::string gw = "context.gpu";
        c.gpu_name = get_string(g, "name", gw, true);
        c.gpu_memory_bytes = get_u64(g, "memory_bytes", gw);
        c.gpu_free_bytes = get_u64(g, "free_bytes", gw);
        c.pcie_generation = get_int(g, "pcie_generation", gw);
        c.pcie_width = get_int(g, "pcie_width", gw);
    }
    if (j.contains("settings")) {
        if (!j["settings"].is_object()) throw std::invalid_argument("context.settings is not an object");
        c.settings = j["settings"];
    } else {
        c.settings = json::object();
    }
    return c;
}

json result_to_json(const CaseResult& r) {
    json metrics = json::object();
    for (const auto& [name, m] : r.metrics)
        metrics[name] = {
            {"unit", m.unit}, {"median", m.median}, {"min", m.min}, {"max", m.max}, {"spread_pct", m.spread_pct()}};
    return {{"case", r.key},
            {"variant", r.variant},
            {"description", r.description},
            {"status", status_name(r.status)},
            {"reason", r.reason},
            {"params", r.params.is_object() ? r.params : json::object()},
            {"repetitions", r.repetitions},
            {"metrics", metrics}};
}

CaseResult result_from_json(const json& j, std::size_t index) {
    const std::string w = "results[" + std::to_string(index) + "]";
    CaseResult r;
    r.key = get_string(j, "case", w, true);
    if (r.key.empty()) throw std::invalid_argument(w + ".case is empty");
    r.variant = get_string(j, "variant", w);
    r.description = get_string(j, "description", w);
    const std::string status = get_string(j, "status", w, true);
    const auto parsed = status_names.find(status);
    if (!parsed) throw std::invalid_argument(w + ".status \"" + status + "\" is not " + status_names.choices());
    r.status = *parsed;
    r.reason = get_string(j, "reason", w);
    if (j.contains("params") && !j["params"].is_null()) {
        if (!j["params"].is_object()) throw std::invalid_argument(w + ".params is not an object");
        r.params = j["params"];
    } else {
        r.params = json::object();
    }
    r.repetitions = static_cast<unsigned>(get_int(j, "repetitions", w));
    if (j.contains("metrics") && !j["metrics"].is_null()) {
        const json& ms = j["metrics"];
        if (!ms.is_object()) throw std::invalid_argument(w + ".metrics is not an object");
        for (const auto& [name, m] : ms.items()) {
            const std::string mw = w + ".metrics." + name;
            Metric metric;
            metric.unit = get_string(m, "unit", mw, true);
            metric.median = get_number(m, "median", mw, true);
            metric.min = get_number(m, "min", mw);
            metric.max = get_number(m, "max", mw);
            r.metrics.emplace(name, metric);
        }
    }
    return r;
}

// A non-negative integer parameter, or 0 (params built in memory hold signed integers).
std::uint64_t param_u64(const json& params, const char* name) {
    if (!params.is_object() || !params.contains(name)) return 0;
    const json& v = params.at(name);
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<long long>() >= 0) return static_cast<std::uint64_t>(v.get<long long>());
    return 0;
}

std::optional<double> ok_median(const CaseResult* r, std::string_view metric) {
    if (!r || r->status != CaseStatus::ok) return std::nullopt;
    const Metric* m = r->metric(metric);
    if (!m || !(m->median > 0)) return std::nullopt;
    return m->median;
}

} // namespace

std::string_view status_name(CaseStatus s) {
    return status_names.name(s);
}

const Metric* CaseResult::metric(std::string_view name) const {
    auto it = metrics.find(std::string(name));
    return it == metrics.end() ? nullptr : &it->second;
}

const CaseResult* Results::find(std::string_view key, std::string_view variant) const {
    for (const auto& r : results)
        if (r.key == key && (variant.empty() || r.variant == variant)) return &r;
    return nullptr;
}

nlohmann::json results_to_json(const Results& r) {
    json results = json::array();
    for (const auto& c : r.results) results.push_back(result_to_json(c));
    return {{"schema_version", r.schema_version},
            {"tool", "dsbench"},
            {"context", context_to_json(r.context)},
            {"results", results}};
}

std::string serialize_results(const Results& r) {
    return dump_json(results_to_json(r), 2, "the benchmark results") + "\n";
}

Results parse_results(std::string_view json_text, const std::string& source) {
    try {
        const json j = parse_json(json_text);
        if (!j.is_object()) throw std::invalid_argument("the document is not a JSON object");
        const json& version = member(j, "schema_version", "");
        if (!version.is_number_integer()) throw std::invalid_argument("schema_version is not an integer");
        const long long v = version.get<long long>();
        if (v > results_schema_version)
            throw Error(ExitCode::failure, source + ": schema_version " + std::to_string(v) +
                                               " is newer than this dstk reads (" +
                                               std::to_string(results_schema_version) + "); upgrade dstk");
        if (v < 1) throw std::invalid_argument("schema_version " + std::to_string(v) + " is not a valid version");
        Results r;
        r.schema_version = static_cast<int>(v);
        r.context = context_from_json(member(j, "context", ""));
        const json& results = member(j, "results", "");
        if (!results.is_array()) throw std::invalid_argument("results is not an array");
        for (std::size_t i = 0; i < results.size(); ++i) r.results.push_back(result_from_json(results[i], i));
        return r;
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        throw runtime_error(source + ": not a dsbench results file (" + e.what() +
                            "); write one with 'dsbench all DATA --json FILE'");
    }
}

Results load_results(const std::filesystem::path& file) {
    return parse_results(read_input_file(file, "benchmark results", 64ull << 20), file.string());
}

std::optional<double> sequential_read_rate(const Results& r) {
    for (const char* key : {"io.seq.pread.cold", "io.seq.direct", "io.seq.pread.warm"})
        if (auto v = ok_median(r.find(key), "rate")) return v;
    return std::nullopt;
}

std::optional<double> pinned_h2d_rate(const Results& r) {
    const CaseResult* best = nullptr;
    std::uint64_t best_size = 0;
    for (const auto& c : r.results) {
        if (c.key != "h2d.pinned" || c.status != CaseStatus::ok || !c.metric("rate")) continue;
        const std::uint64_t size = param_u64(c.params, "transfer_bytes");
        if (!best || size > best_size) best = &c, best_size = size;
    }
    return ok_median(best, "rate");
}

std::optional<RandomReadFigure> best_random_read(const Results& r, std::string_view granularity) {
    const std::string key = "io.rand." + std::string(granularity) + ".pread.cold";
    std::optional<RandomReadFigure> best;
    for (const auto& c : r.results) {
        if (c.key != key) continue;
        const auto rate = ok_median(&c, "rate");
        if (!rate || (best && *rate <= best->rate)) continue;
        RandomReadFigure f;
        f.rate = *rate;
        f.threads = static_cast<unsigned>(std::min<std::uint64_t>(param_u64(c.params, "threads"), 1u << 20));
        if (const Metric* p99 = c.metric("latency_p99")) f.latency_p99_us = p99->median;
        best = f;
    }
    return best;
}

std::optional<ThreadedRate> rate_at_threads(const Results& r, std::string_view key, unsigned threads) {
    std::optional<ThreadedRate> at_most, smallest;
    for (const auto& c : r.results) {
        if (c.key != key) continue;
        const auto rate = ok_median(&c, "rate");
        if (!rate) continue;
        const ThreadedRate f{static_cast<unsigned>(std::min<std::uint64_t>(param_u64(c.params, "threads"), 1u << 20)),
                             *rate};
        if (f.threads <= threads && (!at_most || f.threads > at_most->threads)) at_most = f;
        if (!smallest || f.threads < smallest->threads) smallest = f;
    }
    return at_most ? at_most : smallest;
}

} // namespace dstk::bench
