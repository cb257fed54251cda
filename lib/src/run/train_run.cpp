#include "dstk/run/train_run.hpp"

#include "dstk/model/run_model.hpp"
#include "run/cpu_estimate.hpp"
#include "run/stages.hpp"

namespace dstk::run {

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
