#include "dstk/model/saved_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"
#include "dstk/json.hpp"
#include "dstk/model/onnx.hpp"

namespace fs = std::filesystem;

namespace dstk::model {
namespace {

constexpr const char* format_name = "dstk-model";
constexpr const char *classifier_version = "1", *current_version = "2";

std::string floats_json(const std::vector<float>& v) {
    return nlohmann::json(v).dump();
}

// One layer's tensors: where each lives in the flat vectors, and its shape.
struct Slot {
    std::string name;
    std::vector<std::uint64_t> shape;
    bool state = false; // in states (BN running statistics), else in params
    std::uint64_t offset = 0;
};

std::vector<Slot> slots_of(const train::NetworkPlan& plan, std::vector<std::string>* counters) {
    const auto paths = module_paths(plan);
    std::vector<Slot> out;
    for (std::size_t i = 0; i < plan.layers.size(); ++i) {
        const auto& l = plan.layers[i];
        const std::string p = paths[i] + ".";
        const std::uint64_t o = l.param_offset, c = l.in.c;
        switch (l.spec.kind) {
        case train::LayerKind::conv: {
            const std::uint64_t k = l.spec.kernel, n = std::uint64_t{l.spec.out} * c * k * k;
            out.push_back({p + "weight", {l.spec.out, c, k, k}, false, o});
            if (l.spec.bias) out.push_back({p + "bias", {l.spec.out}, false, o + n});
            break;
        }
        case train::LayerKind::linear:
            out.push_back({p + "weight", {l.spec.out, c}, false, o});
            if (l.spec.bias) out.push_back({p + "bias", {l.spec.out}, false, o + std::uint64_t{l.spec.out} * c});
            break;
        case train::LayerKind::batchnorm:
            out.push_back({p + "weight", {c}, false, o});
            out.push_back({p + "bias", {c}, false, o + c});
            out.push_back({p + "running_mean", {c}, true, l.state_offset});
            out.push_back({p + "running_var", {c}, true, l.state_offset + c});
            if (counters) counters->push_back(p + "num_batches_tracked");
            break;
        default:
            break;
        }
    }
    return out;
}

std::uint64_t numel(const std::vector<std::uint64_t>& shape) {
    std::uint64_t n = 1;
    for (const auto d : shape) n *= d;
    return n;
}

std::string meta(const TensorFile& f, const std::string& key, const std::string& source) {
    const auto it = f.metadata.find(key);
    if (it == f.metadata.end())
        throw runtime_error(source + ": no '" + key +
                            "' in the metadata (not a model saved by dstrain --save); save it again with dstrain");
    return it->second;
}

std::uint64_t meta_u64(const TensorFile& f, const std::string& key, const std::string& source) {
    const std::string v = meta(f, key, source);
    try {
        std::size_t used = 0;
        const auto n = std::stoull(v, &used);
        if (used == v.size()) return n;
    } catch (const std::exception&) {
    }
    throw runtime_error(source + ": metadata '" + key + "' is '" + v + "' (expected an integer)");
}

std::vector<float> meta_floats(const TensorFile& f, const std::string& key, const std::string& source) {
    try {
        return parse_json(meta(f, key, source)).get<std::vector<float>>();
    } catch (const nlohmann::json::exception& e) {
        throw runtime_error(source + ": metadata '" + key + "' is not a list of numbers (" + e.what() + ")");
    }
}

train::TensorShape parse_shape(const std::string& s, const std::string& source) {
    train::TensorShape t;
    unsigned c = 0, h = 0, w = 0;
    char tail = 0;
    if (std::sscanf(s.c_str(), "%ux%ux%u%c", &c, &h, &w, &tail) != 3 || !c || !h || !w)
        throw runtime_error(source + ": metadata input_shape '" + s + "' (expected CxHxW)");
    t.c = c, t.h = h, t.w = w;
    return t;
}

} // namespace

train::NetworkPlan SavedModel::plan() const {
    return train::plan_network(spec, input, targets, side_values);
}

std::vector<train::Target> classifier_targets(std::uint32_t classes) {
    return {train::Target{"", DType::i32, Shape{}, train::LossKind::ce, classes}};
}

std::vector<std::string> module_paths(const train::NetworkPlan& plan) {
    // A stack of (path prefix, next index) per open res( block; a head starts afresh.
    std::vector<std::pair<std::string, std::uint32_t>> stack{{"", 0}};
    std::vector<std::string> out;
    std::size_t head = 0;
    for (const auto& l : plan.layers) {
        if (l.spec.kind == train::LayerKind::residual_end) {
            stack.pop_back();
            out.emplace_back();
            continue;
        }
        if (l.spec.kind == train::LayerKind::head) {
            const std::string path = "heads." + plan.heads.at(head++).name;
            out.push_back(path);
            stack = {{path + ".", 0}};
            continue;
        }
        auto& [prefix, next] = stack.back();
        const std::string path = prefix + std::to_string(next++);
        out.push_back(path);
        if (l.spec.kind == train::LayerKind::residual_begin) stack.emplace_back(path + ".body.", 0);
    }
    return out;
}

namespace {

// A version-1 file describes it completely: one ce head, no side input, only the layers version 1 knew.
bool is_classifier(const SavedModel& m) {
    if (m.targets.size() != 1 || m.targets[0].loss != train::LossKind::ce || !m.spec.heads.empty() || m.side_values)
        return false;
    for (const auto& l : m.spec.layers)
        if (l.kind == train::LayerKind::tanh) return false;
    return true;
}

nlohmann::json heads_json(const SavedModel& m, const train::NetworkPlan& plan) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < plan.heads.size(); ++h) {
        const train::Target& t = m.targets[h];
        heads.push_back({{"name", plan.heads[h].name},
                         {"target", t.field},
                         {"dtype", dtype_name(t.dtype)},
                         {"shape", t.shape.dims},
                         {"loss", train::loss_name(t.loss)},
                         {"weight", plan.heads[h].weight},
                         {"outputs", plan.heads[h].target.width}});
    }
    return heads;
}

nlohmann::json side_json(const SavedModel& m) {
    return {{"field", m.side.field},
            {"dtype", dtype_name(m.side.dtype)},
            {"values", m.side_values},
            {"normalize_mean", m.side.mean},
            {"normalize_std", m.side.std}};
}

nlohmann::json meta_json(const TensorFile& f, const std::string& key, const std::string& source) {
    try {
        return parse_json(meta(f, key, source));
    } catch (const nlohmann::json::exception& e) {
        throw runtime_error(source + ": metadata '" + key + "' is not JSON (" + e.what() + ")");
    }
}

DType meta_dtype(const std::string& text, const std::string& what, const std::string& source) {
    const auto dt = dtype_from_name(text);
    if (!dt) throw runtime_error(source + ": metadata " + what + " '" + text + "' is unknown");
    return *dt;
}

// Version 2's "heads" (and version 1's where present: the label field's name).
std::vector<train::Target> parse_targets(const TensorFile& f, const std::string& source) {
    std::vector<train::Target> out;
    try {
        for (const auto& h : meta_json(f, "heads", source)) {
            train::Target t;
            t.field = h.at("target").get<std::string>();
            t.dtype = meta_dtype(h.at("dtype").get<std::string>(), "head dtype", source);
            t.shape.dims = h.at("shape").get<std::vector<std::uint64_t>>();
            t.loss = train::parse_loss(h.at("loss").get<std::string>(), source + ": metadata head loss");
            t.width = std::min<std::uint32_t>(h.at("outputs").get<std::uint32_t>(), 1u << 24);
            out.push_back(std::move(t));
        }
    } catch (const nlohmann::json::exception& e) {
        throw runtime_error(source + ": metadata 'heads' (" + e.what() + ")");
    }
    if (out.empty() || out.size() > 16)
        throw runtime_error(source + ": metadata 'heads' lists no head or more than 16");
    return out;
}

void parse_side(const TensorFile& f, const std::string& source, SavedModel& m) {
    if (!f.metadata.count("side_input")) return;
    try {
        const auto j = meta_json(f, "side_input", source);
        m.side.field = j.at("field").get<std::string>();
        m.side.dtype = meta_dtype(j.at("dtype").get<std::string>(), "side input dtype", source);
        m.side_values = std::min<std::uint32_t>(j.at("values").get<std::uint32_t>(), 1u << 20);
        m.side.mean = j.at("normalize_mean").get<std::vector<float>>();
        m.side.std = j.at("normalize_std").get<std::vector<float>>();
    } catch (const nlohmann::json::exception& e) {
        throw runtime_error(source + ": metadata 'side_input' (" + e.what() + ")");
    }
    if (m.side.mean.empty() || m.side.mean.size() != m.side.std.size() || m.side_values % m.side.mean.size() != 0)
        throw runtime_error(source + ": the side input's normalisation does not fit its " +
                            std::to_string(m.side_values) + " values");
}

// The metadata of version 1 and 2, checked; the tensors are read by from_tensor_file.
SavedModel model_metadata(const TensorFile& f, const std::string& source) {
    const std::string version = meta(f, "format_version", source);
    if (meta(f, "format", source) != format_name || (version != classifier_version && version != current_version))
        throw runtime_error(source + ": format '" + meta(f, "format", source) + "' version " + version +
                            " (this dstrain reads " + format_name + " versions 1 and 2)");
    SavedModel m;
    try {
        m.spec = train::parse_model_spec(meta(f, "model", source));
    } catch (const Error& e) {
        throw runtime_error(source + ": metadata 'model': " + e.what());
    }
    m.spec.name = meta(f, "model_name", source);
    m.input = parse_shape(meta(f, "input_shape", source), source);
    m.input_dtype = meta_dtype(meta(f, "input_dtype", source), "input_dtype", source);
    if (version == classifier_version) {
        m.targets = classifier_targets(
            static_cast<std::uint32_t>(std::min<std::uint64_t>(meta_u64(f, "classes", source), 1u << 24)));
        if (f.metadata.count("heads")) m.targets[0].field = parse_targets(f, source)[0].field;
    } else {
        m.targets = parse_targets(f, source);
        parse_side(f, source, m);
    }
    m.mean = meta_floats(f, "normalize_mean", source);
    m.std = meta_floats(f, "normalize_std", source);
    if (m.mean.size() != m.input.c || m.std.size() != m.input.c)
        throw runtime_error(source + ": normalisation has " + std::to_string(m.mean.size()) + " means and " +
                            std::to_string(m.std.size()) + " stds for " + std::to_string(m.input.c) + " channels");
    m.precision = meta(f, "precision", source);
    m.dstk_version = meta(f, "dstk_version", source);
    m.dataset = meta(f, "dataset", source);
    m.dataset_checksum = meta(f, "dataset_checksum", source);
    m.steps = meta_u64(f, "steps", source);
    return m;
}

} // namespace

TensorFile to_tensor_file(const SavedModel& m) {
    const train::NetworkPlan plan = m.plan();
    if (m.params.size() != plan.params || m.states.size() != plan.states)
        throw std::logic_error("SavedModel: parameter counts do not match the plan");
    TensorFile f;
    std::vector<std::string> counters;
    for (const auto& s : slots_of(plan, &counters)) {
        const auto& src = s.state ? m.states : m.params;
        f.tensors.push_back(f32_tensor(s.name, s.shape, std::span<const float>(src).subspan(s.offset, numel(s.shape))));
    }
    for (const auto& c : counters) f.tensors.push_back(i64_scalar(c, static_cast<std::int64_t>(m.steps)));
    const bool classifier = is_classifier(m);
    f.metadata = {{"format", format_name},
                  {"format_version", std::string(classifier ? classifier_version : current_version)},
                  {"model", train::to_spec_string(m.spec)},
                  {"model_name", m.spec.name},
                  {"input_shape", m.input.str()},
                  {"input_dtype", std::string(dtype_name(m.input_dtype))},
                  {"input_layout", "NCHW"},
                  {"heads", heads_json(m, plan).dump()},
                  {"normalize_mean", floats_json(m.mean)},
                  {"normalize_std", floats_json(m.std)},
                  {"bn_eps", "1e-05"},
                  {"precision", m.precision},
                  {"dstk_version", m.dstk_version},
                  {"dataset", m.dataset},
                  {"dataset_checksum", m.dataset_checksum},
                  {"steps", std::to_string(m.steps)}};
    if (classifier) f.metadata["classes"] = std::to_string(plan.heads[0].target.width);
    if (m.side_values) f.metadata["side_input"] = side_json(m).dump();
    return f;
}

SavedModel from_tensor_file(const TensorFile& f, const std::string& source) {
    SavedModel m = model_metadata(f, source);
    train::NetworkPlan plan;
    try {
        plan = m.plan();
    } catch (const Error& e) {
        throw runtime_error(source + ": the saved model does not plan (" + e.what() + ")");
    }
    // Every tensor is checked before anything is allocated: the sizes the
    // metadata implies are then bounded by the file's.
    std::vector<std::string> counters;
    std::set<std::string> expected;
    const auto slots = slots_of(plan, &counters);
    for (const auto& s : slots) {
        expected.insert(s.name);
        const Tensor* t = f.find(s.name);
        if (!t) throw runtime_error(source + ": tensor '" + s.name + "' is missing (the file is incomplete)");
        if (t->dtype != DType::f32 || t->shape != s.shape)
            throw runtime_error(source + ": tensor '" + s.name + "' is " + std::string(dtype_name(t->dtype)) + " " +
                                nlohmann::json(t->shape).dump() + ", expected f32 " + nlohmann::json(s.shape).dump());
    }
    m.params.resize(plan.params);
    m.states.resize(plan.states);
    for (const auto& s : slots) {
        const Tensor* t = f.find(s.name);
        float* dst = (s.state ? m.states : m.params).data() + s.offset;
        std::memcpy(dst, t->data.data(), t->data.size());
        // Such a model's every output is NaN: evaluating it would print figures of nothing.
        if (!std::all_of(dst, dst + t->data.size() / sizeof(float), [](float v) { return std::isfinite(v); }))
            throw runtime_error(source + ": tensor '" + s.name +
                                "' holds NaN or Inf values (saved by a run that diverged?); train the model again, "
                                "with a lower learning rate");
    }
    for (const auto& c : counters) {
        expected.insert(c);
        const Tensor* t = f.find(c);
        if (!t || t->dtype != DType::i64 || !t->shape.empty())
            throw runtime_error(source + ": tensor '" + c + "' is missing or not an i64 scalar");
    }
    for (const auto& t : f.tensors)
        if (!expected.count(t.name))
            throw runtime_error(source + ": tensor '" + t.name + "' does not belong to the model '" +
                                train::to_spec_string(m.spec) + "' (damaged or edited file)");
    return m;
}

std::vector<std::uint8_t> encode_model(const fs::path& path, const SavedModel& m) {
    const std::string ext = path.extension().string();
    if (ext == ".onnx") return encode_onnx(m);
    if (ext == ".safetensors") return encode_safetensors(to_tensor_file(m));
    throw usage_error("--save '" + path.string() + "' (unknown extension '" + ext +
                      "'); name the file *.safetensors or *.onnx");
}

void save_model(const fs::path& path, const SavedModel& m, bool force) {
    const std::vector<std::uint8_t> bytes = encode_model(path, m);
    check_overwrite(path, force);
    check_replaceable(path);
    AtomicFile out(path, force);
    out.write(bytes.data(), bytes.size());
    out.commit();
}

void check_replaceable(const fs::path& path) {
    std::error_code ec;
    const auto st = fs::symlink_status(path, ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
        throw usage_error("'" + path.string() +
                          "' exists and is not a regular file (a model replaces only a file); "
                          "--save elsewhere");
}

SavedModel load_model(const fs::path& path) {
    if (path.extension() == ".onnx")
        throw usage_error("'" + path.string() +
                          "' is an ONNX export (dstrain reads its own .safetensors; give the model.safetensors "
                          "written beside it)");
    return from_tensor_file(read_safetensors(path), path.string());
}

void check_same_network(const SavedModel& m, const train::NetworkPlan& plan, const std::string& source) {
    std::string diffs;
    auto differ = [&](const std::string& what, const std::string& file, const std::string& here) {
        if (file != here) diffs += (diffs.empty() ? "" : "; ") + what + " " + file + " in the file, " + here + " here";
    };
    train::ModelSpec planned{plan.name, {}, {}};
    for (const auto& l : plan.layers) planned.layers.push_back(l.spec);
    for (const auto& h : plan.heads)
        if (h.begin >= 0) planned.heads.push_back({h.name, h.target.field, h.target.loss, h.weight});
    differ("model", train::to_spec_string(m.spec), train::to_spec_string(planned));
    differ("input", m.input.str(), plan.input.str());
    differ("side input values", std::to_string(m.side_values), std::to_string(plan.side));
    for (std::size_t h = 0; h < std::min(m.targets.size(), plan.heads.size()); ++h) {
        const train::Target &a = m.targets[h], &b = plan.heads[h].target;
        const std::string who = plan.heads[h].name.empty() ? "" : " of head " + plan.heads[h].name;
        differ("outputs" + who, std::to_string(a.width), std::to_string(b.width));
        differ("loss" + who, std::string(train::loss_name(a.loss)), std::string(train::loss_name(b.loss)));
    }
    if (!diffs.empty())
        throw usage_error("'" + source + "' holds another network (" + diffs +
                          "); give --model and data that match it, or train from scratch without --init-from");
}

} // namespace dstk::model
