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
#include "dstk/widen.hpp"
#include "train/backends.hpp"
#include "train/head_loss.hpp"

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
        split_ = s->name;
    }
    std::uint64_t read(void* dst, std::uint64_t max) override {
        const std::uint64_t n = std::min(max, total - at_);
        if (n) reader_->read(at_, n, dst);
        at_ += n;
        return n;
    }
    const Dataset& dataset() const { return ds_; }
    const std::string& split() const { return split_; }

  private:
    Dataset ds_;
    const FieldReader* reader_ = nullptr;
    std::string split_;
    std::uint64_t at_ = 0;
};

// Another field of a split, read in step with its input (a side input).
class FieldInput final : public SampleInput {
  public:
    FieldInput(const FieldReader& r, std::uint64_t samples, std::string src) : reader_(r) {
        dtype = r.info().dtype;
        total = samples;
        source = std::move(src);
    }
    std::uint64_t read(void* dst, std::uint64_t max) override {
        const std::uint64_t n = std::min(max, total - at_);
        if (n) reader_.read(at_, n, dst);
        at_ += n;
        return n;
    }

  private:
    const FieldReader& reader_;
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

// The side input beside `in`: its field of a dataset split, or the --side .npy
// of a .npy input; null for a model without one.
std::unique_ptr<SampleInput> open_side_input(const SavedModel& m, const PredictOptions& p, SampleInput& in) {
    const auto* split = dynamic_cast<SplitInput*>(&in);
    if (!m.side_values) {
        if (!p.side.empty())
            throw usage_error("--side '" + p.side.string() + "' for a model without a side input; drop --side");
        return nullptr;
    }
    std::unique_ptr<SampleInput> side;
    if (split) {
        if (!p.side.empty())
            throw usage_error("--side with a dataset INPUT (the side input is its field '" + m.side.field +
                              "'); --side goes with a .npy INPUT");
        const SplitInfo& s = split->dataset().manifest().split(split->split());
        const FieldInfo* f = s.find(m.side.field);
        if (!f)
            throw usage_error(in.source + " has no field '" + m.side.field + "' (the model's side input of " +
                              std::to_string(m.side_values) + " values per sample)");
        side = std::make_unique<FieldInput>(split->dataset().reader(s.name, f->name), in.total,
                                            in.source + " field " + f->name);
        side->shape = train::tensor_shape_from(f->shape);
    } else {
        if (p.side.empty())
            throw usage_error("the model joins a side input ('" + m.side.field + "', " + std::to_string(m.side_values) +
                              " values per sample): give its values for each sample with --side FILE.npy");
        side = std::make_unique<NpyInput>(p.side);
    }
    if (side->shape.numel() != m.side_values)
        throw usage_error(side->source + " holds " + std::to_string(side->shape.numel()) +
                          " values per sample, but the model's side input takes " + std::to_string(m.side_values));
    return side;
}

// What predict writes for a head's outputs: class probabilities (ce, softmax;
// bce, sigmoid), rates (Poisson losses) or the values themselves (mse).
std::vector<float> prediction(train::LossKind loss, const float* z, std::uint32_t width) {
    switch (loss) {
    case train::LossKind::ce:
        return softmax(z, width);
    case train::LossKind::mse:
        return {z, z + width};
    case train::LossKind::poisson:
    case train::LossKind::poisson_exp:
    case train::LossKind::bce: {
        std::vector<float> p(width);
        for (std::uint32_t j = 0; j < width; ++j) {
            const double v = z[j];
            p[j] = static_cast<float>(loss == train::LossKind::bce       ? 1 / (1 + std::exp(-v))
                                      : loss == train::LossKind::poisson ? (v > 20 ? v : std::log1p(std::exp(v)))
                                                                         : std::exp(v));
        }
        return p;
    }
    }
    return {};
}

// The JSON of one head's prediction: {"class", "probabilities"} (ce),
// {"probabilities"} (bce), {"rates"} (Poisson losses), {"values"} (mse).
nlohmann::json prediction_json(train::LossKind loss, const std::vector<float>& p) {
    switch (loss) {
    case train::LossKind::ce: {
        // NaN or Inf probabilities (outputs that overflowed) name no class.
        if (!std::all_of(p.begin(), p.end(), [](float f) { return std::isfinite(f); }))
            return {{"class", nullptr}, {"probabilities", p}};
        return {{"class", argmax(p.data(), static_cast<std::uint32_t>(p.size()))}, {"probabilities", p}};
    }
    case train::LossKind::bce:
        return {{"probabilities", p}};
    case train::LossKind::poisson:
    case train::LossKind::poisson_exp:
        return {{"rates", p}};
    case train::LossKind::mse:
        break;
    }
    return {{"values", p}};
}

// A .npy of [N, width] f32 rows written as they come; the header gets the
// row count at the end.
class NpyRows {
  public:
    NpyRows(const fs::path& path, bool force, std::uint32_t width) : file_(path, force), width_(width) {
        header_ = make_npy_header(DType::f32, {UINT64_MAX, width_});
        file_.write(header_.data(), header_.size());
    }
    void add(const std::vector<float>& row) {
        file_.write(row.data(), row.size() * 4);
        ++rows_;
    }
    void finish() {
        // The real count's header, padded to the placeholder's length (the data does not move).
        std::string h = make_npy_header(DType::f32, {rows_, width_});
        const std::size_t pad = header_.size() - h.size();
        h.insert(h.size() - 1, pad, ' ');
        const std::size_t len = h.size() - 10;
        h[8] = static_cast<char>(len & 0xff);
        h[9] = static_cast<char>(len >> 8);
        write_all(file_.fd(), h.data(), h.size(), 0, file_.tmp_path());
    }
    AtomicFile& output() { return file_; }

  private:
    AtomicFile file_;
    std::string header_;
    std::uint32_t width_;
    std::uint64_t rows_ = 0;
};

// Where predictions go: JSON lines (stdout or a file), or .npy files of every
// head's predictions (FILE.npy for one head, FILE.HEAD.npy for each of several).
class PredictionSink {
  public:
    PredictionSink(const fs::path& path, bool force, const train::NetworkPlan& plan) : plan_(plan) {
        if (path.empty() || path == "-") return;
        if (path.extension() != ".npy") {
            file_ = std::make_unique<AtomicFile>(path, force);
            return;
        }
        for (const auto& h : plan.heads) {
            fs::path p = path;
            if (plan.heads.size() > 1) p.replace_extension("." + h.name + ".npy");
            npy_.push_back(std::make_unique<NpyRows>(p, force, h.target.width));
        }
    }
    static std::vector<fs::path> files(const fs::path& path, const train::NetworkPlan& plan) {
        if (path.empty() || path == "-") return {};
        if (path.extension() != ".npy" || plan.heads.size() == 1) return {path};
        std::vector<fs::path> out;
        for (const auto& h : plan.heads) out.push_back(fs::path(path).replace_extension("." + h.name + ".npy"));
        return out;
    }
    // One sample: each head's prediction.
    void add(std::uint64_t index, const std::vector<std::vector<float>>& preds) {
        if (!npy_.empty()) {
            for (std::size_t h = 0; h < npy_.size(); ++h) npy_[h]->add(preds[h]);
            return;
        }
        nlohmann::json j{{"index", index}};
        for (std::size_t h = 0; h < preds.size(); ++h) {
            const auto p = prediction_json(plan_.heads[h].target.loss, preds[h]);
            if (preds.size() == 1)
                j.update(p);
            else
                j[plan_.heads[h].name] = p;
        }
        const std::string line = j.dump() + "\n";
        if (file_)
            file_->write(line.data(), line.size());
        else if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size())
            throw runtime_error("cannot write predictions to stdout (closed pipe? disk full?)");
    }
    // The heads' files are put in place together: all of them or none.
    void finish() {
        OutputSet set;
        for (auto& n : npy_) {
            n->finish();
            set.add(n->output());
        }
        if (file_) set.add(*file_);
        set.commit();
        if (!file_ && npy_.empty()) std::fflush(stdout);
    }

  private:
    const train::NetworkPlan& plan_;
    std::unique_ptr<AtomicFile> file_;
    std::vector<std::unique_ptr<NpyRows>> npy_;
};

// The batch fields' host buffers of a Predictor: `batch` samples each.
struct HostFields {
    std::vector<std::vector<std::uint8_t>> bytes;
    std::vector<const void*> data;
    HostFields(const std::vector<BatchField>& fields, std::uint32_t batch) {
        for (const auto& f : fields) bytes.emplace_back(f.sample_bytes() * batch);
        for (auto& b : bytes) data.push_back(b.data());
    }
};

} // namespace

Predictor::Predictor(const SavedModel& m, const DataTypes& types, const InferenceOptions& o, const OutputOptions& out)
    : batch_(o.batch) {
    if (o.batch == 0) throw usage_error("invalid --batch 0 (must be positive)");
    train::TrainerConfig tc;
    std::vector<train::Target> targets = m.targets;
    for (std::size_t h = 0; h < targets.size() && h < types.targets.size(); ++h) targets[h].dtype = types.targets[h];
    for (auto& t : targets)
        if (t.field.empty()) t.field = "y"; // a version-1 file: the label, whatever the dataset calls it
    tc.plan = train::plan_network(m.spec, m.input, targets, m.side_values);
    tc.input_dtype = types.input;
    tc.mean = m.mean;
    tc.std = m.std;
    tc.side = m.side;
    if (types.side) tc.side.dtype = *types.side;
    tc.max_batch = o.batch;
    tc.device = default_device(o, out);
    const auto trained = train::parse_precision(m.precision.empty() ? "fp32" : m.precision);
    tc.precision = tc.device.backend == train::Backend::cpu ? train::Precision::fp32 : o.precision.value_or(trained);
    tc.cpu_threads = o.threads;
    trainer_ = train::make_trainer(tc);
    const std::vector<float> slots(tc.plan.params * tc.optimizer.slots(), 0.0f);
    trainer_->load_state(train::pack_state({m.params, m.states, slots, m.steps}));
    std::uint64_t most = 0;
    for (const BatchField& f : train::batch_fields(tc)) {
        buffers_.push_back(train::make_backend_buffer(tc.device, f.sample_bytes() * o.batch));
        most = std::max(most, f.sample_bytes() * o.batch);
    }
    zeros_.assign(most, 0);
}

Predictor::~Predictor() = default;

const train::TrainerConfig& Predictor::config() const {
    return trainer_->config();
}

std::string Predictor::device() const {
    const auto& c = trainer_->config();
    return train::device_name(c.device) + ", " + std::string(train::precision_name(c.precision));
}

std::vector<std::vector<float>> Predictor::outputs(std::span<const void* const> data, std::uint32_t n) {
    const auto fields = train::batch_fields(config());
    if (n == 0 || n > batch_ || data.size() != fields.size()) throw std::logic_error("Predictor::outputs: bad batch");
    std::vector<const void*> device(fields.size());
    for (std::size_t i = 0; i < fields.size(); ++i) {
        buffers_[i]->upload(0, data[i] ? data[i] : zeros_.data(), n * fields[i].sample_bytes());
        device[i] = buffers_[i]->data();
    }
    trainer_->evaluate(train::step_batch(config(), device, n));
    std::vector<std::vector<float>> out;
    for (const auto& h : config().plan.heads) out.push_back(trainer_->read_activation(h.output));
    return out;
}

train::Metrics Predictor::take_metrics() {
    return trainer_->take_eval_metrics();
}

namespace {

// The field a head of `m` learns in `ds`: its recorded target; for a model of
// one head (or a version-1 file) the dataset's label role where the data has
// no field of that name.
std::string target_field(const SavedModel& m, std::size_t h, const Manifest& man, const std::string& split,
                         const OutputOptions& out) {
    const std::string& recorded = m.targets[h].field;
    const SplitInfo& s = man.split(split);
    if (!recorded.empty() && s.find(recorded)) return recorded;
    if (m.targets.size() == 1 && !man.label_field.empty() && s.find(man.label_field)) {
        if (!recorded.empty())
            note(out, "dstrain: split '" + split + "' has no field '" + recorded +
                          "' (the model's target): using its "
                          "labels, '" +
                          man.label_field + "'");
        return man.label_field;
    }
    std::string fields;
    for (const auto& f : s.fields) fields += (fields.empty() ? "" : ", ") + f.name;
    throw usage_error("split '" + split + "' has no field '" + (recorded.empty() ? man.label_field : recorded) +
                      "', the target of " + (m.targets.size() > 1 ? "head " + std::to_string(h) : "the model") +
                      " (fields: " + fields + "); evaluate on data with the fields the model was trained on");
}

// The readers of every field an evaluation needs, in batch_fields order, checked against the model.
struct EvalFields {
    std::vector<const FieldReader*> readers; // input, targets (per unique field), side
    DataTypes types;
};

EvalFields eval_fields(const SavedModel& m, const Dataset& ds, const std::string& split, const std::string& source,
                       const OutputOptions& out) {
    const Manifest& man = ds.manifest();
    const std::string sname = man.split(split).name;
    EvalFields e;
    e.readers.push_back(&ds.reader(sname, man.input_field));
    e.types.input = e.readers[0]->info().dtype;
    std::vector<std::string> seen;
    for (std::size_t h = 0; h < m.targets.size(); ++h) {
        const std::string name = target_field(m, h, man, split, out);
        const FieldInfo& f = man.split(split).field(name);
        const train::Target& t = m.targets[h];
        if (t.loss == train::LossKind::ce) train::check_loss_fits(t.loss, name, f.dtype, f.shape);
        const std::uint64_t want = t.loss == train::LossKind::ce ? 1 : t.width;
        if (f.shape.numel() != want)
            throw usage_error(source + ": field '" + name + "' holds " + std::to_string(f.shape.numel()) +
                              " values per sample but the model's head predicts " + std::to_string(want));
        e.types.targets.push_back(f.dtype);
        if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
        seen.push_back(name);
        e.readers.push_back(&ds.reader(sname, name));
    }
    if (m.side_values) {
        const FieldInfo* f = man.split(split).find(m.side.field);
        if (!f || f->shape.numel() != m.side_values)
            throw usage_error(source + " has no field '" + m.side.field + "' of " + std::to_string(m.side_values) +
                              " values per sample (the model's side input)");
        e.readers.push_back(&ds.reader(sname, m.side.field));
        e.types.side = f->dtype;
    }
    return e;
}

// Per-class counts (and the confusion matrix where kept) of a ce head from its outputs.
void count_classes(EvalHead& e, const std::vector<float>& z, const void* labels, DType dtype, std::uint32_t n,
                   std::uint32_t k, const std::string& source) {
    for (std::uint32_t i = 0; i < n; ++i) {
        const float v = widen_float(labels, dtype, i);
        if (!(v >= 0 && v < static_cast<float>(k)))
            throw runtime_error(source + ": label " + std::to_string(static_cast<long long>(v)) + " of '" + e.target +
                                "' is outside the model's " + std::to_string(k) + " classes");
        const float* zi = z.data() + std::uint64_t{i} * k;
        const auto y = static_cast<std::uint32_t>(v);
        // The rule of the headline accuracy (head_loss): outputs with a NaN or
        // Inf are no prediction, right in no row and in no column.
        const bool predicted = std::all_of(zi, zi + k, [](float f) { return std::isfinite(f); });
        ++e.class_samples[y];
        e.class_correct[y] += train::label_rank(zi, k, y) == 0;
        if (predicted && !e.confusion.empty()) ++e.confusion[std::uint64_t{y} * k + argmax(zi, k)];
    }
}

} // namespace

EvalReport evaluate_model(const SavedModel& m, const fs::path& dataset, const std::string& split,
                          const InferenceOptions& o, const OutputOptions& out, bool confusion) {
    SplitInput in(dataset, split);
    check_input_shape(in.shape, m, in.source, out);
    check_input_dtype(in.dtype, m, in.source, out);
    if (in.total == 0) throw usage_error(in.source + " is empty (nothing to evaluate)");
    const EvalFields ef = eval_fields(m, in.dataset(), split, in.source, out);
    Predictor p(m, ef.types, o, out);
    const auto& plan = p.config().plan;
    const auto fields = train::batch_fields(p.config());
    EvalReport r;
    r.model = m.spec.name + " (" + train::to_spec_string(m.spec) + ")";
    r.dataset = dataset.string();
    r.split = split;
    r.device = p.device();
    for (const auto& h : plan.heads) {
        EvalHead e{h.name, h.target.field, {}, {}, {}, {}};
        if (h.target.loss == train::LossKind::ce) {
            e.class_samples.assign(h.target.width, 0);
            e.class_correct.assign(h.target.width, 0);
            if (confusion || h.target.width <= confusion_limit)
                e.confusion.assign(std::uint64_t{h.target.width} * h.target.width, 0);
        }
        r.heads.push_back(std::move(e));
    }
    HostFields host(fields, p.batch());
    Progress progress("eval", in.total, in.total * fields[0].sample_bytes(), out);
    for (std::uint64_t n; (n = in.read(host.bytes[0].data(), p.batch())) > 0;) {
        throw_if_interrupted();
        for (std::size_t i = 1; i < fields.size(); ++i) ef.readers[i]->read(r.samples, n, host.bytes[i].data());
        const auto outs = p.outputs(host.data, static_cast<std::uint32_t>(n));
        for (std::size_t h = 0; h < plan.heads.size(); ++h) {
            const train::Target& t = plan.heads[h].target;
            if (t.loss != train::LossKind::ce) continue;
            const std::size_t f = static_cast<std::size_t>(
                std::find_if(fields.begin(), fields.end(), [&](const BatchField& b) { return b.name == t.field; }) -
                fields.begin());
            count_classes(r.heads[h], outs[h], host.data[f], t.dtype, static_cast<std::uint32_t>(n), t.width,
                          in.source);
        }
        r.samples += n;
        progress.add(n, n * fields[0].sample_bytes());
    }
    progress.finish();
    const train::Metrics mt = p.take_metrics();
    r.loss = mt.loss();
    for (std::size_t h = 0; h < plan.heads.size(); ++h) r.heads[h].metrics = mt.heads[h];
    return r;
}

namespace {

void class_table(std::ostringstream& o, const EvalHead& e) {
    char buf[128];
    const auto k = static_cast<std::uint32_t>(e.class_samples.size());
    o << "class  samples  accuracy\n";
    for (std::uint32_t c = 0; c < k; ++c) {
        const std::uint64_t n = e.class_samples[c];
        if (n)
            std::snprintf(buf, sizeof buf, "%5u  %7llu  %.2f%%\n", c, static_cast<unsigned long long>(n),
                          100.0 * static_cast<double>(e.class_correct[c]) / static_cast<double>(n));
        else
            std::snprintf(buf, sizeof buf, "%5u  %7d  -\n", c, 0);
        o << buf;
    }
    o << "confusion matrix (rows: true class, columns: predicted class)\n      ";
    for (std::uint32_t c = 0; c < k; ++c) {
        std::snprintf(buf, sizeof buf, " %6u", c);
        o << buf;
    }
    o << "\n";
    for (std::uint32_t c = 0; c < k; ++c) {
        std::snprintf(buf, sizeof buf, "%5u ", c);
        o << buf;
        for (std::uint32_t p = 0; p < k; ++p) {
            std::snprintf(buf, sizeof buf, " %6llu",
                          static_cast<unsigned long long>(e.confusion[std::uint64_t{c} * k + p]));
            o << buf;
        }
        o << "\n";
    }
}

bool is_classifier(const EvalReport& r) {
    return r.heads.size() == 1 && r.heads[0].metrics.kind == train::LossKind::ce;
}

} // namespace

std::string eval_report_text(const EvalReport& r) {
    std::ostringstream o;
    char buf[160];
    o << "model " << r.model << "\n"
      << r.dataset << " split " << r.split << ": " << format_count(r.samples) << " samples, device " << r.device
      << "\n";
    if (is_classifier(r)) {
        const train::HeadMetrics& m = r.heads[0].metrics;
        std::snprintf(buf, sizeof buf, "loss %.4f  accuracy %.2f%% (%llu of %llu)", r.loss, 100 * m.accuracy(),
                      static_cast<unsigned long long>(m.correct), static_cast<unsigned long long>(r.samples));
        o << buf;
        if (m.width > 5) {
            std::snprintf(buf, sizeof buf, "  top-5 %.2f%%", 100 * m.top5_accuracy());
            o << buf;
        }
        o << "\n";
    } else {
        std::snprintf(buf, sizeof buf, "loss %.4f%s\n", r.loss, r.heads.size() > 1 ? " (the heads' weighted sum)" : "");
        o << buf;
    }
    for (const EvalHead& e : r.heads) {
        const train::HeadMetrics& m = e.metrics;
        if (!is_classifier(r)) {
            std::snprintf(buf, sizeof buf, "  loss %.4f  ", m.loss());
            o << "head" << (e.name.empty() ? "" : " " + e.name) << " (" << train::loss_name(m.kind) << " on '"
              << e.target << "', " << m.width << (m.kind == train::LossKind::ce ? " classes" : " outputs")
              << "):" << buf << train::figures_text(m) << "\n";
        }
        if (m.kind != train::LossKind::ce) continue;
        if (!e.confusion.empty())
            class_table(o, e);
        else
            o << "(the per-class table and confusion matrix of " << m.width << " classes are left out above "
              << confusion_limit << " classes; --confusion prints them)\n";
    }
    return o.str();
}

std::string eval_report_json(const EvalReport& r) {
    nlohmann::json heads = nlohmann::json::array();
    for (const EvalHead& e : r.heads) {
        nlohmann::json h{{"name", e.name}, {"target", e.target}, {"loss_kind", train::loss_name(e.metrics.kind)}};
        for (const auto& f : train::figures(e.metrics)) h[f.key] = f.value;
        if (e.metrics.kind == train::LossKind::ce) {
            h["correct"] = e.metrics.correct;
            const auto k = static_cast<std::uint32_t>(e.class_samples.size());
            if (!e.confusion.empty()) {
                nlohmann::json per_class = nlohmann::json::array(), confusion = nlohmann::json::array();
                for (std::uint32_t c = 0; c < k; ++c) {
                    const std::uint64_t n = e.class_samples[c];
                    per_class.push_back({{"class", c},
                                         {"samples", n},
                                         {"correct", e.class_correct[c]},
                                         {"accuracy", n ? static_cast<double>(e.class_correct[c]) / n : 0.0}});
                    confusion.push_back(std::vector<std::uint64_t>(e.confusion.begin() + std::uint64_t{c} * k,
                                                                   e.confusion.begin() + std::uint64_t{c + 1} * k));
                }
                h["per_class"] = per_class;
                h["confusion"] = confusion;
            }
        }
        heads.push_back(h);
    }
    nlohmann::json j{{"schema_version", 1}, {"model", r.model},     {"dataset", r.dataset}, {"split", r.split},
                     {"device", r.device},  {"samples", r.samples}, {"loss", r.loss},       {"heads", heads}};
    if (is_classifier(r)) // the figures of a classifier's one head at the top, as before heads existed
        for (const char* key : {"correct", "accuracy", "top5_accuracy", "per_class", "confusion"})
            if (heads[0].contains(key)) j[key] = heads[0][key];
    return j.dump(2) + "\n";
}

std::uint64_t predict(const SavedModel& m, const PredictOptions& po, const InferenceOptions& o,
                      const OutputOptions& out) {
    const auto in = open_input(po);
    // NumPy has no bfloat16: bf16 samples travel as u2 (dstk-format(5)).
    if (in->dtype == DType::u16 && m.input_dtype == DType::bf16) in->dtype = DType::bf16;
    check_input_shape(in->shape, m, in->source, out);
    check_input_dtype(in->dtype, m, in->source, out);
    const auto side = open_side_input(m, po, *in);
    DataTypes types{in->dtype, {}, side ? std::optional<DType>(side->dtype) : std::nullopt};
    Predictor p(m, types, o, out);
    const auto& plan = p.config().plan;
    const auto fields = train::batch_fields(p.config());
    for (const auto& f : PredictionSink::files(po.output, plan)) check_overwrite(f, po.force);
    PredictionSink sink(po.output, po.force, plan);
    HostFields host(fields, p.batch());
    for (std::size_t i = 1; i < fields.size(); ++i) host.data[i] = nullptr; // targets: zeros
    if (side) host.data.back() = host.bytes.back().data();
    Progress progress("predict", in->total, in->total * fields[0].sample_bytes(), out);
    std::uint64_t done = 0;
    for (std::uint64_t n; (n = in->read(host.bytes[0].data(), p.batch())) > 0;) {
        throw_if_interrupted();
        if (side && side->read(host.bytes.back().data(), n) != n)
            throw usage_error(side->source + " holds fewer samples than " + in->source);
        const auto outs = p.outputs(host.data, static_cast<std::uint32_t>(n));
        (void)p.take_metrics();
        for (std::uint64_t i = 0; i < n; ++i) {
            std::vector<std::vector<float>> preds;
            for (std::size_t h = 0; h < plan.heads.size(); ++h) {
                const std::uint32_t w = plan.heads[h].target.width;
                preds.push_back(prediction(plan.heads[h].target.loss, outs[h].data() + i * w, w));
            }
            sink.add(done + i, preds);
        }
        done += n;
        progress.add(n, n * fields[0].sample_bytes());
    }
    progress.finish();
    sink.finish();
    return done;
}

} // namespace dstk::model
