// dstrain's loop: epochs of steps, evaluation, checkpoints, SIGINT/SIGTERM.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>
#include <utility>

#include "clock.hpp"
#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/output.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"
#include "run/stages.hpp"
#include "dstk/gpu_runtime.hpp"
#include "run/tensorboard_log.hpp"

namespace dstk::run {
namespace {

using data::Clock;
using data::seconds_since;

// Training-mode compute time: wall time of train_step on the cpu; on cuda
// CUDA events around one step in sample_every on the compute stream, read
// back lazily and scaled to every step. Not every step: each event recorded
// between two steps delays the next step's start (the GPU drains the stream
// to time it), which bracketing every step made a visible share of a small
// model's step.
class ComputeTimer {
  public:
    static constexpr std::uint64_t sample_every = 16;
    explicit ComputeTimer(void* stream) : stream_(stream) {
        if (!stream_) return;
        pairs_.resize(8);
        span_.emplace();
    }
    ComputeTimer(const ComputeTimer&) = delete;
    ComputeTimer& operator=(const ComputeTimer&) = delete;

    template <class F> void time(F&& step) {
        if (!stream_) {
            const auto t0 = Clock::now();
            step();
            seconds_ += seconds_since(t0);
            return;
        }
        if (!span_open_) span_->start.record(stream_);
        span_open_ = true;
        if (steps_++ % sample_every != 0) {
            step();
            return;
        }
        Pair& p = pairs_[turn_++ % pairs_.size()];
        collect(p);
        p.start.record(stream_);
        step();
        p.end.record(stream_);
        p.pending = true;
    }
    // The steps' GPU time since the last take() (the timed steps' mean times
    // the steps, on cuda); `between`, where given, gets the GPU time from the
    // first step's start to the last one's end that no step covers (the GPU
    // idle waiting for the host, or for a batch).
    double take(double* between = nullptr) {
        double span = 0.0;
        for (auto& p : pairs_) collect(p);
        if (span_open_) {
            span_->end.record(stream_); // after the last step enqueued
            span_->end.synchronize();
            span = span_->end.elapsed_ms(span_->start) / 1000.0;
            span_open_ = false;
        }
        const double compute = stream_ && timed_ ? seconds_ / static_cast<double>(timed_) * steps_ : seconds_;
        if (between) *between = std::max(0.0, span - compute);
        seconds_ = 0.0;
        steps_ = timed_ = 0;
        return compute;
    }

  private:
    struct Pair {
        // A constructor of its own, not default member initializers: clang
        // cannot default-construct a nested class that has them (std::optional
        // and std::vector of it) before the enclosing class is complete.
        Pair() : start(true), end(true) {}
        gpu::Event start, end;
        bool pending = false;
    };
    void collect(Pair& p) {
        if (!p.pending) return;
        p.end.synchronize();
        seconds_ += p.end.elapsed_ms(p.start) / 1000.0;
        ++timed_;
        p.pending = false;
    }
    void* stream_;
    std::vector<Pair> pairs_;  // cuda: a ring of step timings
    std::optional<Pair> span_; // cuda: first step's start to the last one's end
    bool span_open_ = false;
    std::size_t turn_ = 0;
    std::uint64_t steps_ = 0, timed_ = 0; // since the last take()
    double seconds_ = 0;
};

void add_step(LoopTimes& t, Clock::time_point t0, Clock::time_point t1, Clock::time_point t2, Clock::time_point t3) {
    t.next += std::chrono::duration<double>(t1 - t0).count();
    t.launch += std::chrono::duration<double>(t2 - t1).count();
    t.rest += std::chrono::duration<double>(t3 - t2).count();
    t.slowest_step = std::max(t.slowest_step, std::chrono::duration<double>(t3 - t0).count());
    ++t.steps;
}

// The line inside an epoch on a terminal (or with --progress): steps,
// samples/s, ETA and the share of the time spent waiting for batches.
class EpochProgress {
  public:
    EpochProgress(const std::string& label, std::uint64_t steps, std::uint32_t batch, const OutputOptions& out)
        : progress_(label, steps, 0, out, "steps"), batch_(batch) {}
    // After each step, with the seconds waited for batches so far.
    void step(double waited) {
        if (!progress_.enabled()) return;
        ++steps_;
        if (steps_ == 1 || seconds_since(shown_) >= 0.15) {
            const double secs = std::max(1e-9, seconds_since(start_));
            progress_.set_detail(format_count(static_cast<std::uint64_t>(static_cast<double>(steps_ * batch_) / secs)) +
                                 " samples/s  read wait " + fixed(100 * waited / secs, 1) + "%");
            shown_ = Clock::now();
        }
        progress_.add(1, 0);
    }
    void finish() { progress_.finish(); }

  private:
    Progress progress_;
    std::uint64_t batch_, steps_ = 0;
    Clock::time_point start_ = Clock::now(), shown_ = start_;
};

class Loop {
  public:
    Loop(Session& s, const TrainOptions& e, const DataOptions& d, const OutputOptions& out, const Checkpointer& ck,
         CheckpointPosition pos, const Ceiling& c, JsonLog& log, RunReport& r)
        : s_(s), e_(e), d_(d), out_(out), ck_(ck), pos_(pos), c_(c), log_(log), r_(r),
          compute_(s.trainer->compute_stream()), steps_(pos.steps), board_(s.root() ? e.tensorboard : "", out) {}

    void run() {
        if (s_.on_gpu()) s_.meter->reset_peak();
        sampled_ = Clock::now();
        for (std::uint64_t epoch = pos_.epoch; epoch < e_.epochs && !stopped_; ++epoch) epoch_of(epoch);
    }

  private:
    void epoch_of(std::uint64_t epoch) {
        const auto t0 = Clock::now();
        EpochOutcome o;
        o.report.epoch = static_cast<std::uint32_t>(epoch + 1);
        o.report.lr = train::learning_rate(s_.tc.optimizer, s_.tc.schedule, steps_);
        const std::uint64_t first = epoch == pos_.epoch ? pos_.next_batch : 0;
        epoch_at_ = {epoch, steps_ - pos_.steps, first};
        if (s_.mix && s_.mix->resumed && epoch == pos_.epoch)
            s_.mix->train->resume_epoch(*s_.mix->resumed, epoch, first);
        else
            s_.train_src->start_epoch(epoch, first);
        std::uint64_t batch_index = first;
        window_ = {Clock::now(), 0, 0.0};
        EpochProgress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(e_.epochs),
                               s_.steps_per_epoch - first, static_cast<std::uint32_t>(s_.global_batch()), out_);
        for (auto h0 = Clock::now(); const Batch* b = s_.train_src->next(); h0 = Clock::now()) {
            const auto h1 = Clock::now();
            compute_.time([&] { s_.trainer->train_step(*b); });
            const auto h2 = Clock::now();
            s_.train_src->release();
            ++batch_index;
            ++steps_;
            const bool stop = after_step({epoch, batch_index, steps_});
            add_step(o.loop, h0, h1, h2, Clock::now());
            progress.step(o.loop.next);
            if (board_.due()) board_point(o.loop);
            if (stop) break;
        }
        progress.finish();
        s_.trainer->synchronize();
        check_loss();
        o.stages = s_.train_src->take_times();
        o.stages.compute = compute_.take(&o.loop.between);
        if (epoch == pos_.epoch) o.stages.read += c_.load_seconds;
        if (board_.on()) board_point(o.loop); // the epoch's last steps
        o.report.train = std::exchange(taken_, {});
        o.report.train.add(s_.trainer->take_train_metrics());
        const auto t1 = Clock::now();
        if (d_.eval_every == 0 || stopped_) o.report.test = evaluate();
        check_finite(o.report.test);
        o.report.train_seconds = std::chrono::duration<double>(t1 - t0).count();
        o.report.samples_per_second =
            static_cast<double>(o.report.train.samples) / std::max(1e-9, o.report.train_seconds);
        world_figures(o.report);
        if (!e_.log_json.empty() && s_.root()) o.index_hashes = batch_hashes(epoch, first, batch_index);
        o.first_batch = first;
        o.report.seconds = seconds_since(t0);
        // A mix's epoch resumed with other weights has its own length.
        const bool epoch_done = batch_index >= s_.train_src->batches_per_epoch();
        ck_.write(*s_.trainer, epoch_done ? CheckpointPosition{epoch + 1, 0, steps_}
                                          : CheckpointPosition{epoch, batch_index, steps_});
        r_.epochs.push_back(o.report);
        o.steps = steps_;
        o.whole = epoch_done && first == 0;
        o.peak = epoch_peak();
        o.peaks = s_.world->gather(o.peak);
        o.peak = *std::max_element(o.peaks.begin(), o.peaks.end());
        if (s_.root()) report_epoch(s_, e_, o, c_, log_, out_);
        if (s_.root()) report_mix_epoch(s_, out_);
        board_.epoch(s_, o, c_);
        if (s_.on_gpu() && !c_.managed && !warned_ceiling_ && o.peak > c_.bytes) {
            warned_ceiling_ = true;
            warn_over_ceiling(o.peak, c_, r_);
        }
    }

    // Sampling, signals, checkpoints, evaluation and --max-steps after a step;
    // true when the run stops here.
    bool after_step(const CheckpointPosition& here) {
        if (s_.on_gpu() && seconds_since(sampled_) >= 0.25) {
            s_.meter->sample();
            sampled_ = Clock::now();
        }
        // One decision for all ranks: a rank that stopped alone would leave
        // the others waiting in the next step's reduction.
        if (s_.world->any(interrupted())) {
            s_.trainer->synchronize();
            ck_.write(*s_.trainer, here);
            throw Error(
                ExitCode::interrupted,
                "interrupted at epoch " + std::to_string(here.epoch + 1) + ", step " + std::to_string(here.steps) +
                    (d_.checkpoint.empty() ? std::string(" (no --checkpoint: progress is lost)")
                                           : "; checkpoint written to " + checkpoint_path(d_.checkpoint).string() +
                                                 ", continue with --resume"));
        }
        if (d_.checkpoint_every && here.steps % d_.checkpoint_every == 0 && here.next_batch < s_.steps_per_epoch) {
            check_finite();
            ck_.write(*s_.trainer, here);
        }
        if (d_.eval_every && here.steps % d_.eval_every == 0 && s_.test_src) {
            const train::Metrics m = evaluate();
            check_test_loss(m);
            report_eval(here.steps, m, log_, out_);
            board_.eval(here.steps, m);
        }
        if (d_.max_steps && here.steps >= d_.max_steps) stopped_ = true;
        return stopped_;
    }

    // Divergence ends the run with a runtime error before a checkpoint, an
    // epoch report or the model holds it: a NaN or Inf training loss in the
    // epoch so far, test loss or weight. The last checkpoint written stays.
    [[noreturn]] void diverged(const std::string& what) const {
        throw runtime_error(what +
                            " (training diverged, or the data holds NaN or Inf values the start-up scan did not "
                            "sample) lower --lr (now " +
                            std::to_string(s_.tc.optimizer.lr) + ") or add warm-up with --warmup-epochs" +
                            (d_.checkpoint.empty() ? "" : "; the last checkpoint is kept"));
    }
    // "epoch 2, step 7 of 12": the epoch and its steps taken so far, or the step `at`.
    std::string where(std::optional<std::uint64_t> at = std::nullopt) const {
        // first_nonfinite_step counts steps since the trainer was built or loaded.
        const std::uint64_t step = at ? *at + 1 : steps_ - pos_.steps;
        return "epoch " + std::to_string(epoch_at_.epoch + 1) + ", step " +
               std::to_string(step - epoch_at_.start + epoch_at_.first) + " of " + std::to_string(s_.steps_per_epoch);
    }
    void check_loss() {
        if (const auto bad = s_.trainer->first_nonfinite_step()) diverged("non-finite loss at " + where(*bad));
    }
    void check_test_loss(const train::Metrics& test) const {
        if (test.samples && !std::isfinite(test.loss()))
            diverged("non-finite test loss (" + std::to_string(test.loss()) + ") after " + where());
    }
    // Before a checkpoint and at the end of an epoch: the update after a step
    // may leave the weights non-finite while every loss so far was finite.
    void check_finite(const train::Metrics& test = {}) {
        check_loss();
        check_test_loss(test);
        auto finite = [](const std::vector<float>& v) {
            return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
        };
        if (!finite(s_.trainer->read_parameters()) || !finite(s_.trainer->read_states()))
            diverged("non-finite weights after " + where());
    }

    train::Metrics evaluate() {
        if (!s_.test_src) return {};
        s_.trainer->average_states(); // the ranks' BN statistics differ; every rank evaluates the whole test split
        s_.test_src->start_epoch(0, 0);
        while (const Batch* b = s_.test_src->next()) {
            s_.trainer->evaluate(*b);
            s_.test_src->release();
        }
        (void)s_.test_src->take_times();
        return s_.trainer->take_eval_metrics();
    }

    // The world's training figures: metrics and samples/s summed over the
    // ranks (each rank trained its slice of every global batch).
    void world_figures(EpochReport& er) {
        if (s_.ranks() == 1) return;
        std::vector<double> v = er.train.pack();
        v.push_back(er.samples_per_second);
        s_.world->sum(v);
        er.samples_per_second = v.back();
        v.pop_back();
        er.train.unpack(v);
    }

    // --log-json: for each global step of the epoch taken here, an XXH64 of
    // its sample indices (the global batch, all ranks' slices), so that runs
    // at different rank counts can be compared step by step.
    // A mix's indices are (member << 48) + its draw's position in the member's order.
    std::vector<std::string> batch_hashes(std::uint64_t epoch, std::uint64_t first, std::uint64_t end) const {
        const data::EpochOrder order(s_.sc.order, s_.train_split->samples, epoch);
        const data::MixOrder* mix = s_.mix ? &s_.mix->train->order() : nullptr;
        const std::uint64_t g = s_.global_batch();
        std::vector<std::uint64_t> indices(g);
        std::vector<std::string> hashes;
        for (std::uint64_t k = first; k < end; ++k) {
            for (std::uint64_t i = 0; i < g; ++i) {
                if (!mix) {
                    indices[i] = order[k * g + i];
                    continue;
                }
                const data::MixDraw d = (*mix)[k * g + i];
                indices[i] = (std::uint64_t{d.member} << 48) + d.local;
            }
            char hex[17];
            std::snprintf(
                hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(xxh64(indices.data(), indices.size() * sizeof(std::uint64_t))));
            hashes.emplace_back(hex);
        }
        return hashes;
    }

    // --tensorboard: a step point over the steps since the previous one. It
    // takes the trainer's metrics, which the epoch's figures then add up.
    void board_point(const LoopTimes& t) {
        const train::Metrics m = s_.trainer->take_train_metrics();
        taken_.add(m);
        StepWindow w;
        w.step = steps_;
        w.steps = t.steps - window_.first_step;
        w.train = m;
        w.seconds = seconds_since(window_.start);
        w.host_wait = t.next - window_.waited;
        w.lr = train::learning_rate(s_.tc.optimizer, s_.tc.schedule, steps_);
        w.host_rss = current_rss_bytes();
        if (s_.on_gpu()) w.gpu_peak = s_.meter->peak();
        w.ranks = s_.ranks();
        board_.step(w);
        window_ = {Clock::now(), t.steps, t.next};
    }

    // The epoch's peak: samples every 0.25 s of training and one after evaluation and checkpoint.
    std::uint64_t epoch_peak() {
        if (!s_.on_gpu()) return 0;
        s_.meter->sample();
        const std::uint64_t peak = s_.meter->peak();
        s_.meter->reset_peak();
        sampled_ = Clock::now();
        r_.peak_device_bytes = std::max(r_.peak_device_bytes, peak);
        return peak;
    }

    Session& s_;
    const TrainOptions& e_;
    const DataOptions& d_;
    const OutputOptions& out_;
    const Checkpointer& ck_;
    const CheckpointPosition pos_;
    const Ceiling& c_;
    JsonLog& log_;
    RunReport& r_;
    ComputeTimer compute_;
    std::uint64_t steps_;
    Clock::time_point sampled_;
    bool stopped_ = false, warned_ceiling_ = false;
    struct {
        std::uint64_t epoch = 0, start = 0, first = 0; // the epoch; its first step since the trainer's start; batch
    } epoch_at_;
    TensorBoardLog board_;
    train::Metrics taken_; // this epoch's metrics taken for step points
    struct {
        Clock::time_point start;
        std::uint64_t first_step = 0; // LoopTimes::steps at the window's start
        double waited = 0;            // LoopTimes::next there
    } window_;
};

} // namespace

Checkpointer::Checkpointer(const Session& s, const TrainOptions& e, const DataOptions& d)
    : world_(*s.world), mix_(s.mix ? &*s.mix : nullptr), d_(d), seed_(e.seed), command_line_(e.command_line),
      given_options_(e.given_options),
      run_{
          // A mix's members are matched by their keys (mix_run.hpp): they may change.
          {"dataset_samples", s.mix ? std::string("mix") : std::to_string(s.train_split->samples)},
          {"dataset_checksum", s.mix ? std::string("mix") : s.x->checksum},
          {"model", train::to_spec_string(s.spec)},
          {"batch", std::to_string(s.global_batch())}, // the global batch: a resume may change the rank count
          {"epochs", std::to_string(e.epochs)},
          {"optimizer", std::string(train::optimizer_name(e.optimizer))},
          {"lr", fixed(s.tc.optimizer.lr, 6)},
          {"schedule", std::string(train::schedule_name(e.schedule))},
          {"order", d.order},
          {"window", std::to_string(d.window)},
          {"chunk_samples", std::to_string(s.sc.order.chunk_samples)},
          {"seed", std::to_string(e.seed)},
          {"precision", std::string(train::precision_name(s.precision))},
      } {
    // What a model learns from, where it is more than the dataset's labels
    // with softmax cross-entropy (checkpoints of such runs have no entry).
    const auto& heads = s.tc.plan.heads;
    if (heads.size() == 1 && heads[0].name.empty() && heads[0].target.loss == train::LossKind::ce &&
        heads[0].target.field == s.ds->manifest().label_field && !s.tc.plan.side)
        return;
    std::string targets;
    for (const auto& h : heads)
        targets += (targets.empty() ? "" : ",") + h.target.field + ":" + std::string(train::loss_name(h.target.loss));
    if (s.tc.plan.side) targets += ",side:" + s.tc.side.field;
    run_["targets"] = targets;
}

CheckpointPosition Checkpointer::start(Session& s, const OutputOptions& out) const {
    train::Trainer& t = *s.trainer;
    if (!d_.resume) {
        if (!d_.checkpoint.empty() && checkpoint_exists(d_.checkpoint))
            throw usage_error("'" + d_.checkpoint.string() +
                              "' already holds a checkpoint; add --resume to continue it, or remove it");
        return {};
    }
    const Checkpoint c = load_checkpoint(d_.checkpoint);
    check_resume_compatible(c, run_, d_.checkpoint);
    t.load_state(c.trainer_state);
    const CheckpointPosition pos = c.position;
    if (c.run.at("epochs") != run_.at("epochs"))
        note(out, "dstrain: --epochs " + run_.at("epochs") + " (was " + c.run.at("epochs") +
                      "): the learning-rate schedule now spans the longer run");
    note(out, "dstrain: resumed from " + checkpoint_path(d_.checkpoint).string() + " at epoch " +
                  std::to_string(pos.epoch + 1) + ", batch " + std::to_string(pos.next_batch) + " (step " +
                  std::to_string(pos.steps) + ")");
    if (s.mix) resume_mix(s, c.mix, pos, out);
    return pos;
}

void Checkpointer::write(train::Trainer& t, const CheckpointPosition& p) const {
    if (d_.checkpoint.empty()) return;
    t.average_states();
    if (world_.root()) save(t, p);
    // A rank that went on (or exited, on SIGINT) before the file is in place
    // could have the launcher end rank 0 mid-write.
    world_.barrier();
}

void Checkpointer::save(train::Trainer& t, const CheckpointPosition& p) const {
    Checkpoint c;
    c.position = p;
    c.seed = seed_;
    c.run = run_;
    c.created = now_iso8601();
    c.command_line = command_line_;
    c.options = given_options_;
    if (mix_) c.mix = mix_checkpoint(*mix_, p);
    c.trainer_state = t.save_state();
    save_checkpoint(d_.checkpoint, c);
}

void train_epochs(Session& s, const TrainOptions& e, const DataOptions& d, const OutputOptions& out,
                  const Checkpointer& ck, CheckpointPosition pos, const Ceiling& c, JsonLog& log, RunReport& r) {
    Loop(s, e, d, out, ck, pos, c, log, r).run();
}

} // namespace dstk::run
