#include "dstk/model/infer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dstk/atomic_output.hpp"
#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/npy.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"
#include "train/backends.hpp"

namespace fs = std::filesystem;

namespace dstk::model {
namespace {

train::Device default_device(const InferenceOptions& o, const OutputOptions& out) {
    if (o.device) return *o.device;
    std::string why;
    if (!detect_gpus(&why).empty()) return {train::Backend::cuda, 0};
    note(out, "dstrain: no GPU (" + why + "): running on the CPU");
    return {train::Backend::cpu, 0};
}

void check_input_dtype(DType given, const SavedModel& m, const std::string& source, const OutputOptions& out) {
    if (!train::is_input_dtype(given))
        throw usage_error(source + " holds " + std::string(dtype_name(given)) +
                          " samples (the model reads u8, bf16, f16 or f32); convert them with dsconvert --dtype");
    if (given != m.input_dtype)
        note(out, "dstrain: " + source + " holds " + std::string(dtype_name(given)) +
                      " samples, the model was trained "
                      "on " +
                      std::string(dtype_name(m.input_dtype)) + ": values are taken in the same units");
}

// A flat sample (N x D, what x.reshape(N, -1) makes of N x C x H x W) of
// the model's size is taken as the model's sample in C order; any other shape
// must be the model's. Channels-last images of the right size are refused
// with the transpose that fixes them: read flat, they would be wrong silently.
void check_input_shape(const train::TensorShape& given, const SavedModel& m, const std::string& source,
                       const OutputOptions& out) {
    if (given == m.input) return;
    const bool flat = given.h == 1 && given.w == 1;
    if (flat && given.numel() == m.input.numel()) {
        note(out, "dstrain: " + source + " holds flat samples of " + std::to_string(given.numel()) +
                      " values: read as the model's " + m.input.str() + " (C x H x W, row-major)");
        return;
    }
    std::string fix = "data of another kind, or in another layout?";
    if (given.numel() == m.input.numel())
        fix = given.c == m.input.h && given.h == m.input.w && given.w == m.input.c
                  ? "channels last? numpy.ascontiguousarray(x.transpose(0, 3, 1, 2)) makes N x C x H x W"
                  : "the same number of values in another shape: x.reshape(len(x), -1) if they are the model's "
                    "samples in C order";
    throw usage_error(source + " holds samples of " + given.str() + " but the model takes " + m.input.str() + " (" +
                      fix + ")");
}

std::vector<float> softmax(const float* logits, std::uint32_t classes) {
    const float top = *std::max_element(logits, logits + classes);
    std::vector<float> p(classes);
    double sum = 0;
    for (std::uint32_t k = 0; k < classes; ++k) sum += std::exp(static_cast<double>(logits[k]) - top);
    for (std::uint32_t k = 0; k < classes; ++k)
        p[k] = static_cast<float>(std::exp(static_cast<double>(logits[k]) - top) / sum);
    return p;
}

std::uint32_t argmax(const float* v, std::uint32_t n) {
    return static_cast<std::uint32_t>(std::max_element(v, v + n) - v);
}

// Samples to predict, read in order.
class SampleInput {
  public:
    virtual ~SampleInput() = default;
    virtual std::uint64_t read(void* dst, std::uint64_t max) = 0; // samples read; 0 at the end
    DType dtype = DType::f32;
    train::TensorShape shape;
    std::uint64_t total = 0; // 0 where unknown (stdin)
    std::string source;
};

class SplitInput final : public SampleInput {
  public:
    SplitInput(const fs::path& dir, const std::string& split) : ds_(Dataset::open(dir)) {
        const Manifest& m = ds_.manifest();
        const SplitInfo* s = m.find(split);
        if (!s) throw usage_error(dir.string() + " has no split '" + split + "' (choose one with --split)");
        reader_ = &ds_.reader(s->name, m.input_field);
        dtype = reader_->info().dtype;
        shape = train::tensor_shape_from(reader_->info().shape);
        total = s->samples;
        source = dir.string() + " split " + split;
    }
    std::uint64_t read(void* dst, std::uint64_t max) override {
        const std::uint64_t n = std::min(max, total - at_);
        if (n) reader_->read(at_, n, dst);
        at_ += n;
        return n;
    }
    const Dataset& dataset() const { return ds_; }

  private:
    Dataset ds_;
    const FieldReader* reader_ = nullptr;
    std::uint64_t at_ = 0;
};

// A .npy file or a .npy on stdin, read front to back (a pipe cannot seek).
class NpyInput final : public SampleInput {
  public:
    explicit NpyInput(const fs::path& path) {
        if (path == "-") {
            fd_ = STDIN_FILENO;
            source = "<stdin>";
        } else {
            owned_ = open_input_file(path, "input");
            fd_ = owned_.get();
            source = path.string();
        }
        std::vector<std::uint8_t> head(10);
        read_exact(head.data(), head.size(), true);
        if (head[6] >= 2) {
            head.resize(12);
            read_exact(head.data() + 10, 2, true);
        }
        const std::size_t len =
            head[6] >= 2 ? 12 + (head[8] | head[9] << 8 | std::size_t{head[10]} << 16 | std::size_t{head[11]} << 24)
                         : 10 + (head[8] | std::size_t{head[9]} << 8);
        if (len > (1u << 20) + 12) throw runtime_error(source + ": .npy header of " + std::to_string(len) + " bytes");
        const std::size_t had = head.size();
        head.resize(len);
        read_exact(head.data() + had, len - had, true);
        const NpyHeader h = parse_npy_header(head, source);
        if (h.fortran_order || h.big_endian)
            throw usage_error(source + ": Fortran-order or big-endian .npy (write it C-order little-endian: "
                                       "numpy.ascontiguousarray(x).astype(x.dtype.newbyteorder('<')))");
        if (h.shape.size() < 2)
            throw usage_error(source + ": a .npy of shape " + nlohmann::json(h.shape).dump() +
                              " (expected samples first: N x C x H x W, N x H x W or N x D)");
        dtype = h.dtype;
        shape = train::tensor_shape_from(Shape{{h.shape.begin() + 1, h.shape.end()}});
        total = h.shape[0];
        sample_bytes_ = dstk::sample_bytes(Shape{{h.shape.begin() + 1, h.shape.end()}}, dtype);
    }
    std::uint64_t read(void* dst, std::uint64_t max) override {
        const std::uint64_t n = std::min(max, total - at_);
        if (n) read_exact(dst, n * sample_bytes_, false);
        at_ += n;
        return n;
    }

  private:
    void read_exact(void* dst, std::size_t len, bool header) {
        auto* p = static_cast<char*>(dst);
        while (len > 0) {
            const ssize_t r = ::read(fd_, p, len);
            if (r < 0 && errno == EINTR) {
                throw_if_interrupted();
                continue;
            }
            if (r < 0) throw_errno("cannot read", source);
            if (r == 0)
                throw runtime_error(source + ": ends inside the " + (header ? "header" : "data") +
                                    " (truncated .npy?)");
            p += r;
            len -= static_cast<std::size_t>(r);
        }
    }
    UniqueFd owned_;
    int fd_ = -1;
    std::uint64_t at_ = 0, sample_bytes_ = 0;
};

std::unique_ptr<SampleInput> open_input(const PredictOptions& p) {
    std::error_code ec;
    if (p.input != "-" && fs::is_directory(p.input, ec)) return std::make_unique<SplitInput>(p.input, p.split);
    if (p.input != "-" && p.input.extension() != ".npy")
        throw usage_error("predict input '" + p.input.string() +
                          "' (expected a dataset directory, a .npy file, or - for a .npy on stdin)");
    return std::make_unique<NpyInput>(p.input);
}

// Where predictions go: JSON lines (stdout or a file), or a .npy of
// probabilities whose header gets the sample count at the end.
class PredictionSink {
  public:
    PredictionSink(const fs::path& path, bool force, std::uint32_t classes) : classes_(classes) {
        if (path.empty() || path == "-") return;
        file_ = std::make_unique<AtomicFile>(path, force);
        npy_ = path.extension() == ".npy";
        if (npy_) {
            header_ = make_npy_header(DType::f32, {UINT64_MAX, classes_});
            file_->write(header_.data(), header_.size());
        }
    }
    void add(std::uint64_t index, const std::vector<float>& probs) {
        if (npy_) {
            file_->write(probs.data(), probs.size() * 4);
        } else {
            const nlohmann::json j{
                {"index", index}, {"class", argmax(probs.data(), classes_)}, {"probabilities", probs}};
            const std::string line = j.dump() + "\n";
            if (file_)
                file_->write(line.data(), line.size());
            else if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size())
                throw runtime_error("cannot write predictions to stdout (closed pipe? disk full?)");
        }
        ++count_;
    }
    void finish() {
        if (npy_) {
            // The real count's header, padded to the placeholder's length (the data does not move).
            std::string h = make_npy_header(DType::f32, {count_, classes_});
            const std::size_t pad = header_.size() - h.size();
            h.insert(h.size() - 1, pad, ' ');
            const std::size_t len = h.size() - 10;
            h[8] = static_cast<char>(len & 0xff);
            h[9] = static_cast<char>(len >> 8);
            write_all(file_->fd(), h.data(), h.size(), 0, file_->tmp_path());
        }
        if (file_)
            file_->commit();
        else
            std::fflush(stdout);
    }

  private:
    std::unique_ptr<AtomicFile> file_;
    bool npy_ = false;
    std::string header_;
    std::uint32_t classes_;
    std::uint64_t count_ = 0;
};

} // namespace

Predictor::Predictor(const SavedModel& m, DType input_dtype, const InferenceOptions& o, const OutputOptions& out)
    : batch_(o.batch), classes_(m.classes) {
    if (o.batch == 0) throw usage_error("invalid --batch 0 (must be positive)");
    train::TrainerConfig tc;
    tc.plan = m.plan();
    tc.input_dtype = input_dtype;
    tc.mean = m.mean;
    tc.std = m.std;
    tc.max_batch = o.batch;
    tc.device = default_device(o, out);
    const auto trained = train::parse_precision(m.precision.empty() ? "fp32" : m.precision);
    tc.precision = tc.device.backend == train::Backend::cpu ? train::Precision::fp32 : o.precision.value_or(trained);
    tc.cpu_threads = o.threads;
    trainer_ = train::make_trainer(tc);
    const std::vector<float> slots(tc.plan.params * tc.optimizer.slots(), 0.0f);
    trainer_->load_state(train::pack_state({m.params, m.states, slots, m.steps}));
    sample_bytes_ = tc.plan.input.numel() * dtype_size(input_dtype);
    x_ = train::make_backend_buffer(tc.device, sample_bytes_ * o.batch);
    y_ = train::make_backend_buffer(tc.device, 4ull * o.batch);
    zeros_.assign(o.batch, 0);
}

Predictor::~Predictor() = default;

std::string Predictor::device() const {
    const auto& c = trainer_->config();
    return train::device_name(c.device) + ", " + std::string(train::precision_name(c.precision));
}

std::vector<float> Predictor::logits(const void* x, std::uint32_t n, const std::int32_t* labels) {
    if (n == 0 || n > batch_) throw std::logic_error("Predictor::logits: bad batch size");
    x_->upload(0, x, n * sample_bytes_);
    y_->upload(0, labels ? labels : zeros_.data(), 4ull * n);
    trainer_->evaluate(
        train::step_batch(trainer_->config(), x_->data(), static_cast<const std::int32_t*>(y_->data()), n));
    std::vector<float> out = trainer_->read_activation(trainer_->config().plan.layers.size() - 1);
    if (!labels) (void)trainer_->take_eval_metrics();
    return out;
}

train::Metrics Predictor::take_metrics() {
    return trainer_->take_eval_metrics();
}

EvalReport evaluate_model(const SavedModel& m, const fs::path& dataset, const std::string& split,
                          const InferenceOptions& o, const OutputOptions& out) {
    SplitInput in(dataset, split);
    check_input_shape(in.shape, m, in.source, out);
    check_input_dtype(in.dtype, m, in.source, out);
    const Dataset& ds = in.dataset();
    const Manifest& man = ds.manifest();
    const FieldInfo& y = man.split(split).field(man.label_field);
    if (y.dtype != DType::i32 || y.shape.numel() != 1)
        throw usage_error(in.source + ": labels are " + std::string(dtype_name(y.dtype)) + " " + y.shape.str() +
                          " (evaluation needs one i32 label per sample; convert them with dsconvert)");
    if (in.total == 0) throw usage_error(in.source + " is empty (nothing to evaluate)");
    const FieldReader& labels = ds.reader(man.split(split).name, man.label_field);

    Predictor p(m, in.dtype, o, out);
    EvalReport r;
    r.model = m.spec.name + " (" + train::to_spec_string(m.spec) + ")";
    r.dataset = dataset.string();
    r.split = split;
    r.device = p.device();
    r.classes = m.classes;
    r.confusion.assign(std::uint64_t{m.classes} * m.classes, 0);
    std::vector<std::uint8_t> x(p.sample_bytes() * p.batch());
    std::vector<std::int32_t> lab(p.batch());
    Progress progress("eval", in.total, in.total * p.sample_bytes(), out);
    for (std::uint64_t n; (n = in.read(x.data(), p.batch())) > 0;) {
        throw_if_interrupted();
        labels.read(r.samples, n, lab.data());
        for (std::uint64_t i = 0; i < n; ++i)
            if (lab[i] < 0 || static_cast<std::uint32_t>(lab[i]) >= m.classes)
                throw runtime_error(in.source + ": label " + std::to_string(lab[i]) + " of sample " +
                                    std::to_string(r.samples + i) + " is outside the model's " +
                                    std::to_string(m.classes) + " classes");
        const auto logits = p.logits(x.data(), static_cast<std::uint32_t>(n), lab.data());
        for (std::uint64_t i = 0; i < n; ++i) {
            const std::uint32_t k = argmax(logits.data() + i * m.classes, m.classes);
            ++r.confusion[static_cast<std::uint64_t>(lab[i]) * m.classes + k];
            r.correct += k == static_cast<std::uint32_t>(lab[i]);
        }
        r.samples += n;
        progress.add(n, n * p.sample_bytes());
    }
    progress.finish();
    r.loss = p.take_metrics().loss();
    return r;
}

std::string eval_report_text(const EvalReport& r) {
    std::ostringstream o;
    char buf[128];
    o << "model " << r.model << "\n"
      << r.dataset << " split " << r.split << ": " << format_count(r.samples) << " samples, device " << r.device
      << "\n";
    std::snprintf(buf, sizeof buf, "loss %.4f  accuracy %.2f%% (%llu of %llu)\n", r.loss, 100 * r.accuracy(),
                  static_cast<unsigned long long>(r.correct), static_cast<unsigned long long>(r.samples));
    o << buf << "class  samples  accuracy\n";
    for (std::uint32_t c = 0; c < r.classes; ++c) {
        std::uint64_t n = 0;
        for (std::uint32_t k = 0; k < r.classes; ++k) n += r.confusion[std::uint64_t{c} * r.classes + k];
        const std::uint64_t hit = r.confusion[std::uint64_t{c} * r.classes + c];
        if (n)
            std::snprintf(buf, sizeof buf, "%5u  %7llu  %.2f%%\n", c, static_cast<unsigned long long>(n),
                          100.0 * static_cast<double>(hit) / static_cast<double>(n));
        else
            std::snprintf(buf, sizeof buf, "%5u  %7d  -\n", c, 0);
        o << buf;
    }
    o << "confusion matrix (rows: true class, columns: predicted class)\n      ";
    for (std::uint32_t k = 0; k < r.classes; ++k) {
        std::snprintf(buf, sizeof buf, " %6u", k);
        o << buf;
    }
    o << "\n";
    for (std::uint32_t c = 0; c < r.classes; ++c) {
        std::snprintf(buf, sizeof buf, "%5u ", c);
        o << buf;
        for (std::uint32_t k = 0; k < r.classes; ++k) {
            std::snprintf(buf, sizeof buf, " %6llu",
                          static_cast<unsigned long long>(r.confusion[std::uint64_t{c} * r.classes + k]));
            o << buf;
        }
        o << "\n";
    }
    return o.str();
}

std::string eval_report_json(const EvalReport& r) {
    nlohmann::json per_class = nlohmann::json::array(), confusion = nlohmann::json::array();
    for (std::uint32_t c = 0; c < r.classes; ++c) {
        const auto row = std::vector<std::uint64_t>(r.confusion.begin() + std::uint64_t{c} * r.classes,
                                                    r.confusion.begin() + std::uint64_t{c + 1} * r.classes);
        std::uint64_t n = 0;
        for (const auto v : row) n += v;
        per_class.push_back({{"class", c},
                             {"samples", n},
                             {"correct", row[c]},
                             {"accuracy", n ? static_cast<double>(row[c]) / static_cast<double>(n) : 0.0}});
        confusion.push_back(row);
    }
    const nlohmann::json j{{"schema_version", 1},    {"model", r.model},      {"dataset", r.dataset},
                           {"split", r.split},       {"device", r.device},    {"samples", r.samples},
                           {"correct", r.correct},   {"loss", r.loss},        {"accuracy", r.accuracy()},
                           {"per_class", per_class}, {"confusion", confusion}};
    return j.dump(2) + "\n";
}

std::uint64_t predict(const SavedModel& m, const PredictOptions& po, const InferenceOptions& o,
                      const OutputOptions& out) {
    const auto in = open_input(po);
    // NumPy has no bfloat16: bf16 samples travel as u2 (dstk-format(5)).
    if (in->dtype == DType::u16 && m.input_dtype == DType::bf16) in->dtype = DType::bf16;
    check_input_shape(in->shape, m, in->source, out);
    check_input_dtype(in->dtype, m, in->source, out);
    Predictor p(m, in->dtype, o, out);
    PredictionSink sink(po.output, po.force, m.classes);
    std::vector<std::uint8_t> x(p.sample_bytes() * p.batch());
    Progress progress("predict", in->total, in->total * p.sample_bytes(), out);
    std::uint64_t done = 0;
    for (std::uint64_t n; (n = in->read(x.data(), p.batch())) > 0;) {
        throw_if_interrupted();
        const auto logits = p.logits(x.data(), static_cast<std::uint32_t>(n));
        for (std::uint64_t i = 0; i < n; ++i) sink.add(done + i, softmax(logits.data() + i * m.classes, m.classes));
        done += n;
        progress.add(n, n * p.sample_bytes());
    }
    progress.finish();
    sink.finish();
    return done;
}

} // namespace dstk::model
