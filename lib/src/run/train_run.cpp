#include "dstk/run/train_run.hpp"

#include "dstk/checkpoint.hpp"
#include "dstk/model/run_model.hpp"
#include "run/cpu_estimate.hpp"
#include "run/stages.hpp"

namespace dstk::run {
namespace {

// Every file the run writes, checked before training: a model it could not
// save at the end would be the run lost.
void check_run_outputs(const TrainOptions& e, const DataOptions& d, const std::vector<model::SaveTarget>& save_to) {
    std::vector<OutputName> outputs;
    // A model may go into the checkpoint directory (by default, or with --save
    // DIR/FILE), which the run creates before it saves the model.
    auto normal = [](const std::filesystem::path& p) { return std::filesystem::absolute(p).lexically_normal(); };
    const auto checkpoint_dir =
        d.checkpoint.empty() ? std::filesystem::path() : normal(d.checkpoint / "").parent_path();
    for (const model::SaveTarget& t : save_to) {
        const bool in_checkpoint = !d.checkpoint.empty() && normal(t.path).parent_path() == checkpoint_dir;
        outputs.push_back({t.default_name ? "the model" : "--save", t.path, t.default_name || in_checkpoint});
    }
    if (!e.log_json.empty()) outputs.push_back({"--log-json", e.log_json});
    if (!d.checkpoint.empty()) {
        outputs.push_back({"--checkpoint", d.checkpoint / "", true});
        outputs.push_back({"--checkpoint", checkpoint_path(d.checkpoint), true});
    }
    if (!e.tensorboard.empty()) outputs.push_back({"--tensorboard", std::filesystem::path(e.tensorboard) / "", true});
    check_output_paths(outputs);
}

} // namespace

RunReport run_training(const TrainOptions& given, const DataOptions& d, const OutputOptions& given_out) {
    check_options(given, d);
    Session s;
    TrainOptions e = given;
    join_world(s, e, d, given_out);
    const OutputOptions& out = s.out;
    open_session(s, e, d, out);
    RunReport r = first_report(s);
    describe_session(s, d, r, out);
    const Checkpointer ck(s, e, d);
    const CheckpointPosition pos = ck.start(s, out);
    const auto save_to = model::save_paths(e.files, d.checkpoint, e.log_json, d.resume);
    check_run_outputs(e, d, save_to);
    if (pos.epoch >= e.epochs) {
        note(out, "dstrain: the run in " + d.checkpoint.string() + " is finished (" + std::to_string(e.epochs) +
                      " epochs, " + std::to_string(pos.steps) + " steps); nothing to do: its model is " +
                      save_to.front().path.string() + "; give --epochs N above " + std::to_string(e.epochs) +
                      " to train further");
        return r;
    }
    JsonLog log(s.root() ? e.log_json : std::string(), d.resume, e.files.force);
    const Ceiling c = measure_ceiling(s, pos.epoch, r);
    report_ceiling(s, c, r, log, out);
    estimate_cpu_epoch(s, e, out);
    train_epochs(s, e, d, out, ck, pos, c, log, r);
    s.trainer->average_states(); // every rank: a collective
    if (s.root()) model::save_trained(*s.trainer, s.spec, s.ds->dir().string(), s.x->checksum, save_to, out);
    return r;
}

} // namespace dstk::run
