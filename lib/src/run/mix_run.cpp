// dstrain on a mix (mix_run.hpp): the members from the command line or a
// mix.json, their sources, the checkpoint's mix and the resume of its epoch.
#include "run/mix_run.hpp"

#include <cmath>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"
#include "dstk/units.hpp"
#include "run/stages.hpp"

namespace dstk::run {
namespace {

constexpr std::uint64_t max_mix_file_bytes = 1 << 20;

struct MixFile {
    std::vector<std::filesystem::path> paths;
    std::vector<double> weights;
    std::vector<std::string> placements;
};

std::string member_where(const std::filesystem::path& file, std::size_t i) {
    return file.string() + ": member " + std::to_string(i);
}

double member_weight(const nlohmann::json& w, const std::string& where) {
    if (!w.is_number() || !data::valid_mix_weight(w.get<double>()))
        throw usage_error(where + ": weight " + w.dump() + " (must be a positive number); give a weight above 0");
    return w.get<double>();
}

// mix.json (mix_run.hpp, dstk-format(5)); usage errors name the file, the
// member and the key.
MixFile read_mix_file(const std::filesystem::path& file) {
    const std::string fix = "; see man dstk-format, section MIX FILE";
    nlohmann::json j;
    try {
        j = parse_json(read_input_file(file, "mix file", max_mix_file_bytes));
    } catch (const nlohmann::json::exception& e) {
        throw usage_error(file.string() + ": not valid JSON (" + e.what() + ")" + fix);
    }
    if (!j.is_object() || !j.contains("members") || !j.at("members").is_array() || j.at("members").empty())
        throw usage_error(file.string() +
                          ": no \"members\" list (a mix file is {\"members\": [{\"path\": ...}, ...]})" + fix);
    for (const auto& [key, _] : j.items())
        if (key != "members") throw usage_error(file.string() + ": unknown key \"" + key + "\" (known: members)" + fix);
    MixFile m;
    const std::filesystem::path base = file.parent_path();
    for (std::size_t i = 0; i < j.at("members").size(); ++i) {
        const nlohmann::json& e = j.at("members")[i];
        const std::string where = member_where(file, i);
        if (!e.is_object() || !e.contains("path") || !e.at("path").is_string() ||
            e.at("path").get<std::string>().empty())
            throw usage_error(where + " has no \"path\" (each member is {\"path\": DIR, \"weight\": W})" + fix);
        for (const auto& [key, _] : e.items())
            if (key != "path" && key != "weight" && key != "placement")
                throw usage_error(where + ": unknown key \"" + key + "\" (known: path, weight, placement)" + fix);
        const std::filesystem::path p = e.at("path").get<std::string>();
        m.paths.push_back(p.is_absolute() ? p : base / p);
        if (e.contains("weight")) m.weights.push_back(member_weight(e.at("weight"), where));
        if (e.contains("placement") && !e.at("placement").is_string())
            throw usage_error(where + ": placement must be a string (auto, device, host or stream)" + fix);
        m.placements.push_back(e.contains("placement") ? e.at("placement").get<std::string>() : "auto");
    }
    if (!m.weights.empty() && m.weights.size() != m.paths.size())
        throw usage_error(file.string() + ": " + std::to_string(m.weights.size()) + " of " +
                          std::to_string(m.paths.size()) + " members have a weight (all or none)" + fix);
    return m;
}

bool is_mix_file(const std::filesystem::path& p) {
    std::error_code ec;
    return std::filesystem::is_regular_file(p, ec) && p.extension() == ".json";
}

} // namespace

std::vector<const Dataset*> MixRun::pointers() const {
    std::vector<const Dataset*> out;
    for (const Dataset& d : members) out.push_back(&d);
    return out;
}

std::vector<data::MixMember> MixRun::order_members() const {
    std::vector<data::MixMember> out;
    for (std::size_t i = 0; i < members.size(); ++i) {
        const std::uint64_t n = members[i].manifest().split("train").samples;
        out.push_back({paths[i].string(), data::mix_member_key(members[i]), n,
                       weights.empty() ? static_cast<double>(n) : weights[i]});
    }
    return out;
}

std::vector<std::uint64_t> MixRun::draws() const {
    return data::mix_quotas(order_members());
}

std::uint64_t MixRun::positions() const {
    std::uint64_t n = 0;
    for (std::uint64_t d : draws()) n += d;
    return n;
}

std::optional<MixRun> open_mix(const TrainOptions& e, const DataOptions& d) {
    const std::vector<std::filesystem::path> given =
        e.datasets.empty() ? std::vector<std::filesystem::path>{e.dataset} : e.datasets;
    const bool file = given.size() == 1 && is_mix_file(given[0]);
    if (given.size() < 2 && !file) {
        if (!d.weights.empty() || !d.placements.empty())
            throw usage_error(std::string(d.weights.empty() ? "--placement" : "--weights") +
                              " applies to a mix of datasets (one DATASET given); name two or more datasets, or a "
                              "mix.json, or leave it out");
        return std::nullopt;
    }
    MixRun m;
    std::vector<std::string> placements = d.placements;
    if (file) {
        MixFile f = read_mix_file(given[0]);
        m.paths = f.paths;
        m.weights = f.weights;
        if (placements.empty()) placements = f.placements;
    } else {
        m.paths = given;
    }
    if (!d.weights.empty()) m.weights = d.weights;
    if (d.data != "auto")
        throw usage_error("--data " + d.data +
                          " with a mix of datasets (each member is placed on its own); use "
                          "--placement device, host or stream (one for all, or one per dataset)");
    for (const std::string& p : placements) m.placements.push_back(data::parse_mix_placement(p, "--placement"));
    m.members.reserve(m.paths.size());
    std::set<std::uint64_t> keys;
    for (const std::filesystem::path& p : m.paths) {
        m.members.push_back(Dataset::open(p));
        if (!keys.insert(data::mix_member_key(m.members.back())).second)
            throw usage_error("dataset " + p.string() +
                              " is in the mix twice (the same contents as another member); name each dataset "
                              "once and give it a larger weight instead");
    }
    return m;
}

// --- Session stages (stages.hpp) ---

void open_mix_sources(Session& s, const data::SourceRequest& r, const OutputOptions& out) {
    MixRun& m = *s.mix;
    data::MixRequest mr;
    mr.source = r;
    mr.source.hash_batches = !s.on_gpu() && s.hash_batches; // --log-json on the cpu
    mr.weights = m.weights;
    mr.placements = m.placements;
    const data::MachineFacts facts = data::machine_facts(s.device);
    m.plan = data::plan_mix(m.pointers(), mr, facts);
    for (const std::string& line : data::describe_mix(m.plan)) note(out, "dstrain: " + line);
    for (const data::MixMemberPlan& p : m.plan.members) {
        for (const std::string& line : p.source.notes) note(out, "dstrain: " + line);
        for (const std::string& line : p.source.warnings) warning(line);
    }
    if (s.test_split) {
        data::MixRequest er = mr;
        er.weights = {};
        er.source.split = s.test_split->name;
        er.source.order = data::Order::sequential;
        er.source.drop_last = false;
        er.source.slice = {};
        er.source.host_mem = 0;
        er.source.hash_batches = false;
        er.source.bench.clear();
        er.placements.clear();
        for (const data::MixMemberPlan& p : m.plan.members) er.placements.push_back(p.placement);
        m.eval = data::plan_mix(m.pointers(), er, facts);
    }
    s.sc = m.plan.members[0].source.config;
    s.sc.host_mem = r.host_mem;
    s.placement_why = "a mix of " + std::to_string(m.members.size()) + " datasets, placed per member";
    s.rss_before_sources = current_rss_bytes();
    auto train = data::make_mix_source(m.pointers(), m.plan);
    m.train = train.get();
    s.train_src = std::move(train);
    if (m.eval) s.test_src = data::make_mix_source(m.pointers(), *m.eval);
    if (s.train_src->batches_per_epoch() != s.steps_per_epoch) throw std::logic_error("batches per epoch disagree");
}

std::string mix_checkpoint(const MixRun& m, const CheckpointPosition& p) {
    nlohmann::json members = nlohmann::json::array();
    for (const data::MixMemberPlan& mp : m.plan.members)
        members.push_back({{"path", mp.dataset.string()}, {"key", mp.key}, {"weight", mp.weight}});
    nlohmann::json segments = nlohmann::json::array();
    if (p.next_batch > 0 && m.train)
        for (const data::MixSegment& seg : m.train->order().segments())
            segments.push_back({{"start", seg.start}, {"keys", seg.keys}, {"base", seg.base}, {"count", seg.count}});
    return dump_json({{"members", members}, {"segments", segments}}, -1, "the checkpoint's mix");
}

namespace {

// One line per member: what changed since the checkpoint (weight, added,
// gone), or that nothing did.
void say_changes(const nlohmann::json& was, const data::MixPlan& now, const OutputOptions& out) {
    std::set<std::uint64_t> present;
    bool changed = false;
    for (const data::MixMemberPlan& m : now.members) {
        present.insert(m.key);
        const nlohmann::json* old = nullptr;
        for (const nlohmann::json& o : was)
            if (o.at("key").get<std::uint64_t>() == m.key) old = &o;
        char w[64];
        std::snprintf(w, sizeof w, "%g", m.weight);
        if (!old) {
            note(out, "dstrain: mix: " + m.dataset.string() + " added (weight " + w + ")");
            changed = true;
        } else if (old->at("weight").get<double>() != m.weight) {
            char was_w[64];
            std::snprintf(was_w, sizeof was_w, "%g", old->at("weight").get<double>());
            note(out, "dstrain: mix: " + m.dataset.string() + " weight " + w + " (was " + was_w + ")");
            changed = true;
        } else {
            note(out, "dstrain: mix: " + m.dataset.string() + " unchanged (weight " + w + ")");
        }
    }
    for (const nlohmann::json& o : was)
        if (!present.count(o.at("key").get<std::uint64_t>())) {
            note(out, "dstrain: mix: " + o.at("path").get<std::string>() + " gone (no longer in the mix)");
            changed = true;
        }
    if (changed)
        note(out, "dstrain: mix changed since the checkpoint: the epoch goes on without taking a sample twice; the "
                  "next epochs follow the new weights");
}

} // namespace

void resume_mix(Session& s, const std::string& mix_json, const CheckpointPosition& pos, const OutputOptions& out) {
    MixRun& m = *s.mix;
    nlohmann::json j;
    try {
        j = parse_json(mix_json);
        say_changes(j.at("members"), m.plan, out);
        if (pos.next_batch == 0 || j.at("segments").empty()) return;
        std::vector<data::MixSegment> segments;
        for (const nlohmann::json& seg : j.at("segments"))
            segments.push_back({seg.at("start").get<std::uint64_t>(), seg.at("keys").get<std::vector<std::uint64_t>>(),
                                seg.at("base").get<std::vector<std::uint64_t>>(),
                                seg.at("count").get<std::vector<std::uint64_t>>()});
        const data::MixOrder was(m.plan.seed, pos.epoch, std::move(segments));
        m.resumed = was.resumed(pos.next_batch * s.global_batch(), m.plan.order_members());
    } catch (const nlohmann::json::exception& e) {
        throw runtime_error("the checkpoint's mix is unreadable (" + std::string(e.what()) +
                            "); the checkpoint is damaged: start the run again without --resume");
    }
}

void report_mix_epoch(const Session& s, const OutputOptions& out) {
    if (!s.mix || !s.mix->train) return;
    const std::vector<std::uint64_t> got = s.mix->train->delivered();
    std::uint64_t total = 0;
    for (std::uint64_t g : got) total += g;
    std::string line;
    for (std::size_t i = 0; i < got.size(); ++i) {
        char share[64];
        std::snprintf(share, sizeof share, "%.2f%% (planned %.2f%%)",
                      total ? 100.0 * static_cast<double>(got[i]) / static_cast<double>(total) : 0.0,
                      100.0 * s.mix->plan.members[i].share);
        line += (line.empty() ? "" : ", ") + s.mix->paths[i].string() + " " + share;
    }
    note(out, "dstrain: mix samples this epoch: " + line);
}

} // namespace dstk::run
