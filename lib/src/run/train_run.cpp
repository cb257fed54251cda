#include "dstk/run/train_run.hpp"

#include "run/stages.hpp"

namespace dstk::run {

RunReport run_training(const TrainOptions& e, const DataOptions& d, const OutputOptions& out) {
    check_options(e, d);
    Session s;
    open_session(s, e, d, out);
    RunReport r = first_report(s);
    describe_session(s, d, r, out);
    const Checkpointer ck(s, e, d);
    const CheckpointPosition pos = ck.start(*s.trainer, out);
    JsonLog log(e.log_json, d.resume);
    const Ceiling c = measure_ceiling(s, pos.epoch, r);
    report_ceiling(s, c, r, log, out);
    train_epochs(s, e, d, out, ck, pos, c, log, r);
    return r;
}

} // namespace dstk::run
