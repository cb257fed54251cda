#include "dstk/train/run.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"

namespace dstk::train {
namespace {

struct HostSplit {
    std::vector<std::uint8_t> x;
    std::vector<std::int32_t> y;
    std::uint64_t samples = 0;
};

HostSplit load_split(const Dataset& ds, const SplitInfo& split) {
    const Manifest& m = ds.manifest();
    const FieldInfo& xf = split.field(m.input_field);
    const FieldInfo& yf = split.field(m.label_field);
    if (yf.shape.numel() != 1)
        throw usage_error("split '" + split.name + "': label field '" + yf.name + "' has shape " + yf.shape.str() +
                          " (dstrain needs one class index per sample)");
    HostSplit h;
    h.samples = split.samples;
    h.x.resize(checked_mul(split.samples, xf.sample_bytes(), "split size"));
    ds.read(split.name, xf.name, 0, split.samples, h.x.data());
    std::vector<std::uint8_t> raw(checked_mul(split.samples, yf.sample_bytes(), "label size"));
    ds.read(split.name, yf.name, 0, split.samples, raw.data());
    h.y.resize(split.samples);
    for (std::uint64_t i = 0; i < split.samples; ++i) {
        const std::uint8_t* p = raw.data() + i * dtype_size(yf.dtype);
        std::int64_t v = 0;
        switch (yf.dtype) {
        case DType::u8:
            v = *p;
            break;
        case DType::i8:
            v = static_cast<std::int8_t>(*p);
            break;
        case DType::u16: {
            std::uint16_t t;
            std::memcpy(&t, p, 2);
            v = t;
            break;
        }
        case DType::i16: {
            std::int16_t t;
            std::memcpy(&t, p, 2);
            v = t;
            break;
        }
        case DType::i32: {
            std::int32_t t;
            std::memcpy(&t, p, 4);
            v = t;
            break;
        }
        case DType::i64:
            std::memcpy(&v, p, 8);
            break;
        default:
            throw usage_error("label field '" + yf.name + "' is " + std::string(dtype_name(yf.dtype)) +
                              " (class labels must be integers)");
        }
        if (v < 0 || v > (1 << 24))
            throw runtime_error("split '" + split.name + "' sample " + std::to_string(i) + ": label " +
                                std::to_string(v) + " is not a class index (corrupt labels?)");
        h.y[i] = static_cast<std::int32_t>(v);
    }
    return h;
}

float stored_value(const std::uint8_t* x, DType t, std::uint64_t i) {
    switch (t) {
    case DType::u8:
        return x[i];
    case DType::bf16: {
        std::uint16_t v;
        std::memcpy(&v, x + 2 * i, 2);
        return bf16_to_float(v);
    }
    case DType::f16: {
        std::uint16_t v;
        std::memcpy(&v, x + 2 * i, 2);
        return f16_to_float(v);
    }
    case DType::f32: {
        float v;
        std::memcpy(&v, x + 4 * i, 4);
        return v;
    }
    default:
        return 0.0f;
    }
}

// Per-channel mean and std over (a sample of) the training split, when the manifest has none.
void compute_stats(const HostSplit& s, DType t, TensorShape in, std::vector<float>& mean, std::vector<float>& sd) {
    const std::uint64_t hw = std::uint64_t{in.h} * in.w, per = in.numel();
    const std::uint64_t n = std::min<std::uint64_t>(s.samples, 10000);
    mean.assign(in.c, 0.0f);
    sd.assign(in.c, 1.0f);
    for (std::uint32_t c = 0; c < in.c; ++c) {
        double sum = 0.0, sq = 0.0;
        for (std::uint64_t i = 0; i < n; ++i)
            for (std::uint64_t j = 0; j < hw; ++j) {
                const double v = stored_value(s.x.data(), t, i * per + c * hw + j);
                sum += v;
                sq += v * v;
            }
        const double cnt = static_cast<double>(n * hw), m = sum / cnt;
        mean[c] = static_cast<float>(m);
        const double var = std::max(0.0, sq / cnt - m * m);
        sd[c] = var > 1e-12 ? static_cast<float>(std::sqrt(var)) : 1.0f;
    }
}

std::string percent(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f%%", 100.0 * v);
    return b;
}

nlohmann::json epoch_json(const EpochReport& e, const RunReport& r) {
    return {{"epoch", e.epoch},
            {"train_loss", e.train.loss()},
            {"train_accuracy", e.train.accuracy()},
            {"test_loss", e.test.loss()},
            {"test_accuracy", e.test.accuracy()},
            {"seconds", e.seconds},
            {"train_seconds", e.train_seconds},
            {"samples_per_second", e.samples_per_second},
            {"lr", e.lr},
            {"gpu_memory_planned", r.device == "cpu" ? 0 : r.planned.total()},
            {"gpu_memory_measured", r.measured_device_bytes}};
}

} // namespace

RunReport run_training(const RunOptions& o, const OutputOptions& out) {
    if (o.epochs == 0) throw usage_error("invalid --epochs 0 (must be positive)");
    const Dataset ds = Dataset::open(o.dataset);
    const Manifest& m = ds.manifest();
    const SplitInfo& train_split = m.split("train");
    const SplitInfo* test_split = m.find("test");
    const FieldInfo& xf = train_split.field(m.input_field);

    Device device;
    if (o.device) {
        device = *o.device;
    } else {
        std::string why;
        if (!detect_gpus(&why).empty()) {
            device = {Backend::cuda, 0};
        } else {
            device = {Backend::cpu, 0};
            note(out, "dstrain: no GPU (" + why + "): training on the CPU");
        }
    }
    const Precision precision =
        o.precision.value_or(device.backend == Backend::cpu ? Precision::fp32 : Precision::tf32);
    if (device.backend == Backend::cpu && precision != Precision::fp32)
        note(out, "dstrain: --precision " + std::string(precision_name(precision)) +
                      " applies to the GPU; the CPU computes fp32");

    HostSplit train = load_split(ds, train_split);
    HostSplit test = test_split ? load_split(ds, *test_split) : HostSplit{};
    if (train.samples < o.batch)
        throw usage_error("the train split has " + format_count(train.samples) + " samples, fewer than --batch " +
                          std::to_string(o.batch) + " (use a smaller --batch)");
    std::uint32_t classes = 0;
    if (m.num_classes) {
        classes = *m.num_classes;
    } else {
        for (const auto v : train.y) classes = std::max<std::uint32_t>(classes, static_cast<std::uint32_t>(v) + 1);
        note(out,
             "dstrain: the manifest gives no class count: using " + std::to_string(classes) + " (largest label + 1)");
    }
    for (const HostSplit* s : {&train, &test})
        for (const auto v : s->y)
            if (static_cast<std::uint32_t>(v) >= classes)
                throw runtime_error("label " + std::to_string(v) + " but the dataset has " + std::to_string(classes) +
                                    " classes (corrupt labels or wrong num_classes in dataset.json)");

    TrainerConfig c;
    const TensorShape in = tensor_shape_from(xf.shape);
    c.plan = plan_network(resolve_model(o.model, classes), in, classes);
    c.input_dtype = xf.dtype;
    if (m.stats && m.stats->mean.size() == in.c && m.stats->std.size() == in.c) {
        for (std::uint32_t i = 0; i < in.c; ++i) {
            c.mean.push_back(static_cast<float>(m.stats->mean[i]));
            c.std.push_back(m.stats->std[i] > 0 ? static_cast<float>(m.stats->std[i]) : 1.0f);
        }
    } else {
        compute_stats(train, xf.dtype, in, c.mean, c.std);
    }
    c.max_batch = o.batch;
    c.precision = precision;
    c.optimizer.kind = o.optimizer;
    c.optimizer.lr =
        o.lr.value_or(o.optimizer == OptimizerKind::sgd ? 0.05f * static_cast<float>(o.batch) / 256.0f : 0.002f);
    c.optimizer.momentum = o.momentum;
    c.optimizer.nesterov = o.nesterov;
    c.optimizer.weight_decay = o.weight_decay;
    const std::uint64_t steps_per_epoch = train.samples / o.batch;
    c.schedule.kind = o.schedule;
    c.schedule.total_steps = steps_per_epoch * o.epochs;
    c.schedule.warmup_steps =
        static_cast<std::uint64_t>(std::llround(o.warmup_epochs * static_cast<double>(steps_per_epoch)));
    c.schedule.step_every = o.step_epochs * steps_per_epoch;
    c.schedule.gamma = o.gamma;
    if (o.schedule == ScheduleKind::step && o.step_epochs == 0)
        throw usage_error("--schedule step needs --step-epochs N (decay every N epochs)");
    c.label_smoothing = o.label_smoothing;
    c.seed = o.seed;
    c.device = device;
    c.cpu_threads = o.threads;
    c.workspace_limit = o.workspace;
    c.deterministic = o.deterministic;
    c.kernels = o.kernels;

    RunReport r;
    r.model = c.plan.name;
    r.device = device_name(device);
    r.precision = precision_name(precision);
    r.parameters = c.plan.params;
    if (!out.quiet) {
        note(out, "dstrain: model " + c.plan.name + " (" + to_spec_string(resolve_model(o.model, classes)) + ")");
        note(out, "dstrain: " + format_count(c.plan.params) + " parameters, input " + in.str() + " " +
                      std::string(dtype_name(xf.dtype)) + ", " + std::to_string(classes) + " classes, " +
                      format_count(train.samples) + " train / " + format_count(test.samples) +
                      " test samples, device " + r.device + ", " + r.precision);
    }
    auto trainer = make_trainer(c);
    r.planned = trainer->memory_plan();

    // The whole dataset in the backend's memory (issue 7 streams it instead).
    auto upload = [&](const HostSplit& s) {
        std::pair<std::unique_ptr<BackendBuffer>, std::unique_ptr<BackendBuffer>> b;
        b.first = make_backend_buffer(device, std::max<std::uint64_t>(1, s.x.size()));
        b.second = make_backend_buffer(device, std::max<std::uint64_t>(1, s.y.size() * 4));
        if (!s.x.empty()) b.first->upload(0, s.x.data(), s.x.size());
        if (!s.y.empty()) b.second->upload(0, s.y.data(), s.y.size() * 4);
        return b;
    };
    auto [train_x, train_y] = upload(train);
    auto [test_x, test_y] = upload(test);
    const std::uint64_t data_bytes = train.x.size() + test.x.size() + 4 * (train.y.size() + test.y.size());
    train = HostSplit{};
    if (device.backend == Backend::cuda) {
        r.measured_device_bytes = trainer->measured_device_bytes();
        note(out, "dstrain: GPU memory planned " + format_bytes(r.planned.total()) + " (parameters " +
                      format_bytes(r.planned.parameters) + ", activations " + format_bytes(r.planned.activations) +
                      ", workspace " + format_bytes(r.planned.workspace) + "), measured " +
                      format_bytes(r.measured_device_bytes) + "; dataset " + format_bytes(data_bytes));
    }

    std::ofstream log;
    if (!o.log_json.empty()) {
        log.open(o.log_json, std::ios::trunc);
        if (!log) throw_errno("cannot open --log-json", o.log_json);
    }
    const std::uint64_t sample_bytes = xf.sample_bytes();
    const std::uint64_t test_samples = test.samples;
    for (std::uint32_t epoch = 1; epoch <= o.epochs; ++epoch) {
        const auto t0 = std::chrono::steady_clock::now();
        EpochReport e;
        e.epoch = epoch;
        e.lr = learning_rate(c.optimizer, c.schedule, trainer->steps());
        auto* xb = static_cast<const std::uint8_t*>(train_x->data());
        auto* yb = static_cast<const std::int32_t*>(train_y->data());
        const std::uint64_t first_step = trainer->steps();
        for (std::uint64_t s = 0; s < steps_per_epoch; ++s) {
            trainer->train_step({xb + s * o.batch * sample_bytes, yb + s * o.batch, o.batch});
            if ((s + 1) % 256 == 0) throw_if_interrupted();
        }
        e.train = trainer->take_train_metrics();
        const auto t1 = std::chrono::steady_clock::now();
        if (const auto bad = trainer->first_nonfinite_step())
            throw runtime_error("non-finite loss at epoch " + std::to_string(epoch) + ", step " +
                                std::to_string(*bad - first_step + 1) + " of " + std::to_string(steps_per_epoch) +
                                " (training diverged) lower --lr (now " + std::to_string(c.optimizer.lr) +
                                ") or add warm-up with --warmup-epochs");
        auto* txb = static_cast<const std::uint8_t*>(test_x->data());
        auto* tyb = static_cast<const std::int32_t*>(test_y->data());
        for (std::uint64_t s = 0; s < test_samples; s += o.batch) {
            const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(o.batch, test_samples - s));
            trainer->evaluate({txb + s * sample_bytes, tyb + s, n});
        }
        e.test = trainer->take_eval_metrics();
        const auto t2 = std::chrono::steady_clock::now();
        e.train_seconds = std::chrono::duration<double>(t1 - t0).count();
        e.seconds = std::chrono::duration<double>(t2 - t0).count();
        e.samples_per_second = static_cast<double>(e.train.samples) / std::max(1e-9, e.train_seconds);
        r.epochs.push_back(e);
        std::ostringstream line;
        line << "epoch " << epoch << "/" << o.epochs << "  loss " << std::fixed;
        line.precision(4);
        line << e.train.loss() << "  train acc " << percent(e.train.accuracy()) << "  test acc "
             << (test_samples ? percent(e.test.accuracy()) : std::string("-")) << "  time "
             << format_duration(e.seconds) << "  " << format_count(static_cast<std::uint64_t>(e.samples_per_second))
             << " samples/s";
        if (device.backend == Backend::cuda) line << "  GPU mem " << format_bytes(r.planned.total() + data_bytes);
        if (out.json)
            note(out, line.str());
        else
            std::printf("%s\n", line.str().c_str()), std::fflush(stdout);
        if (log.is_open()) {
            log << epoch_json(e, r).dump() << "\n";
            log.flush();
            if (!log) throw runtime_error("cannot write --log-json " + o.log_json + " (disk full?)");
        }
    }
    return r;
}

std::string run_report_json(const RunReport& r) {
    nlohmann::json j = {{"schema_version", 1},
                        {"tool", "dstrain"},
                        {"model", r.model},
                        {"device", r.device},
                        {"precision", r.precision},
                        {"parameters", r.parameters},
                        {"gpu_memory",
                         {{"planned", r.device == "cpu" ? 0 : r.planned.total()},
                          {"planned_parameters", r.planned.parameters},
                          {"planned_activations", r.planned.activations},
                          {"planned_workspace", r.planned.workspace},
                          {"measured", r.measured_device_bytes},
                          {"ceiling", r.memory_ceiling},
                          {"runtime_overhead", r.runtime_overhead},
                          {"planned_data", r.data_device_bytes},
                          {"peak", r.peak_device_bytes},
                          {"method", r.memory_method}}},
                        {"epochs", nlohmann::json::array()}};
    for (const auto& e : r.epochs) j["epochs"].push_back(epoch_json(e, r));
    return j.dump(2) + "\n";
}

} // namespace dstk::train
