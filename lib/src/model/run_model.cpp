#include "dstk/model/run_model.hpp"

#include <memory>

#include <CLI/CLI.hpp>

#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"
#include "train/backends.hpp"

namespace fs = std::filesystem;

namespace dstk::model {

void add_model_run_options(CLI::App& app, ModelRunOptions& o) {
    app.add_option("--save", o.save,
                   "Write the trained model here at the end of the run: FILE.safetensors (PyTorch names and layouts, "
                   "with metadata) or FILE.onnx; may be given more than once (default: model.safetensors in "
                   "--checkpoint DIR, else beside --log-json, else in the current directory)");
    app.add_option("--init-from", o.init_from,
                   "Start from the weights of a saved model (model.safetensors) instead of a random initialisation; "
                   "its network must be the one --model gives on this data");
    app.add_flag("--force", o.force,
                 "Replace an existing --save or --log-json file (or the default model.safetensors)");
}

std::vector<SaveTarget> save_paths(const ModelRunOptions& o, const fs::path& checkpoint_dir, const fs::path& log_json,
                                   bool replace_own) {
    std::error_code ec;
    auto exists = [&](const fs::path& p) { return fs::exists(fs::symlink_status(p, ec)); };
    const bool may_replace = o.force || replace_own;
    const Replace replace = may_replace ? Replace::earlier : Replace::next_free;
    if (o.save.empty()) {
        const fs::path dir = !checkpoint_dir.empty() ? checkpoint_dir
                             : !log_json.empty()     ? log_json.parent_path()
                                                     : fs::path();
        const fs::path path = dir / default_model_file;
        if (may_replace) check_replaceable(path);
        return {{path, replace, true}};
    }
    std::vector<SaveTarget> targets;
    for (const auto& path : o.save) {
        const std::string ext = path.extension().string();
        if (ext != ".safetensors" && ext != ".onnx")
            throw usage_error("--save '" + path.string() + "' (unknown extension '" + ext +
                              "'); name the file *.safetensors or *.onnx");
        if (exists(path) && !may_replace)
            throw usage_error("'" + path.string() +
                              "' exists (the model of an earlier run?); add --force to replace it, or --save "
                              "elsewhere");
        check_replaceable(path);
        targets.push_back({path, replace, false});
    }
    return targets;
}

SavedModel prepare_init_from(const ModelRunOptions& o, train::TrainerConfig& tc, const OutputOptions& out) {
    SavedModel m = load_model(o.init_from);
    check_same_network(m, tc.plan, o.init_from.string());
    if (m.mean != tc.mean || m.std != tc.std || m.side.mean != tc.side.mean || m.side.std != tc.side.std)
        note(out, "dstrain: --init-from: normalising the input" + std::string(m.side_values ? " and side input" : "") +
                      " with the model's mean and std (those it was trained with), not this dataset's");
    tc.mean = m.mean;
    tc.std = m.std;
    tc.side.mean = m.side.mean;
    tc.side.std = m.side.std;
    return m;
}

void load_weights(train::Trainer& t, const SavedModel& m) {
    const std::vector<float> slots(m.params.size() * t.config().optimizer.slots(), 0.0f);
    t.load_state(train::pack_state({m.params, m.states, slots, 0}));
}

SavedModel model_from_trainer(train::Trainer& t, const train::ModelSpec& spec, const std::string& dataset,
                              const std::string& dataset_checksum) {
    const train::TrainerConfig& c = t.config();
    SavedModel m;
    m.spec = spec;
    m.input = c.plan.input;
    m.input_dtype = c.input_dtype;
    for (const auto& h : c.plan.heads) m.targets.push_back(h.target);
    m.mean = c.mean;
    m.std = c.std;
    m.side = c.side;
    m.side_values = c.plan.side;
    m.precision = std::string(train::precision_name(c.precision));
    m.dataset = dataset;
    m.dataset_checksum = dataset_checksum;
    m.params.resize(c.plan.params);
    m.states.resize(c.plan.states);
    std::vector<float> slots(c.plan.params * c.optimizer.slots());
    m.steps = train::unpack_state(t.save_state(), m.params, m.states, slots);
    return m;
}

void save_trained(train::Trainer& t, const train::ModelSpec& spec, const std::string& dataset,
                  const std::string& dataset_checksum, const std::vector<SaveTarget>& targets,
                  const OutputOptions& out) {
    const SavedModel m = model_from_trainer(t, spec, dataset, dataset_checksum);
    OutputSet set;
    std::vector<std::unique_ptr<AtomicFile>> files;
    for (const SaveTarget& target : targets) {
        const std::vector<std::uint8_t> bytes = encode_model(target.path, m);
        files.push_back(std::make_unique<AtomicFile>(target.path, target.replace));
        files.back()->write(bytes.data(), bytes.size());
        set.add(*files.back());
    }
    set.commit();
    std::string taken; // --save names another process took during the run
    for (std::size_t i = 0; i < targets.size(); ++i) {
        const fs::path& got = files[i]->final_path();
        if (got != targets[i].path && targets[i].default_name)
            note(out, "dstrain: " + targets[i].path.string() + " exists: this run's model goes to " + got.string() +
                          " (--save FILE to choose, --force to replace)");
        else if (got != targets[i].path)
            taken += (taken.empty() ? "" : "; ") + ("'" + targets[i].path.string() +
                                                    "' was created by another process during the run, so this "
                                                    "run's model is '" +
                                                    got.string() + "'");
        note(out, "dstrain: model saved to " + got.string());
    }
    if (!taken.empty()) throw runtime_error(taken + " (nothing was replaced); move the files where you want them");
}

} // namespace dstk::model
