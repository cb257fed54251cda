// The input of dsconvert: its format detected (or given), then opened by
// the format's opener.
#include "formats.hpp"

#include "dstk/enum_names.hpp"

#include <cstring>
#include <tuple>

namespace dstk {
namespace {

Source open_format(const std::filesystem::path& path, InputFormat format, const RawInputOptions& raw, ThreadPool& pool);

using namespace import;

bool has_file_starting(const fs::path& dir, std::string_view prefix, std::string_view suffix = "") {
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(prefix, 0) == 0 && ends_with(n, suffix)) return true;
    }
    return false;
}

InputFormat detect_format(const fs::path& path) {
    if (path == "-") return InputFormat::idx;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st))
        throw runtime_error("cannot open input '" + path.string() + "' (" +
                            (ec ? ec.message() : std::string("No such file or directory")) + ")");
    if (fs::is_directory(st)) {
        if (fs::exists(path / manifest_file_name)) return InputFormat::dataset;
        if (fs::exists(path / "cifar-10-batches-bin") || has_file_starting(path, "data_batch_", ".bin") ||
            fs::exists(path / "test_batch.bin"))
            return InputFormat::cifar10;
        if (has_file_starting(path, "images_", ".bin")) return InputFormat::v28b;
        for (const auto& e : fs::directory_iterator(path)) {
            std::string prefix;
            bool images = false;
            if (idx_name(e.path().filename().string(), prefix, images)) return InputFormat::idx;
        }
        if (has_file_starting(path, "", ".npy")) return InputFormat::npy;
        throw usage_error("cannot tell the format of directory '" + path.string() +
                          "' (no dataset.json, CIFAR-10 batches, v28b, IDX or .npy files); give --from");
    }
    const std::string name = lower(path.filename().string());
    if (ends_with(name, ".npy")) return InputFormat::npy;
    if (ends_with(name, ".npz")) return InputFormat::npz;
    if (name == "test_batch.bin" || name.rfind("data_batch_", 0) == 0) return InputFormat::cifar10;
    File f(path);
    std::uint8_t head[4] = {0, 0, 0, 0};
    if (f.bytes >= 4) read_all(f.fd, head, 4, 0, path);
    if (head[0] == 0x93 && std::memcmp(head + 1, "NUM", 3) == 0) return InputFormat::npy;
    if (head[0] == 'P' && head[1] == 'K') return InputFormat::npz;
    if ((head[0] == 0x1f && head[1] == 0x8b) || name.find("idx") != std::string::npos ||
        (head[0] == 0 && head[1] == 0 && head[2] >= 0x08 && head[2] <= 0x0E))
        return InputFormat::idx;
    return InputFormat::raw;
}

// HWC samples to CHW, block by block: the whole array never sits in memory.
class HwcToChwField final : public FieldStream {
  public:
    HwcToChwField(std::unique_ptr<FieldStream> in, const Shape& hwc, std::size_t elem)
        : in_(std::move(in)), h_(hwc.dims[0]), w_(hwc.dims[1]), c_(hwc.dims[2]), elem_(elem) {}
    void read(std::uint64_t count, void* dst) override {
        tmp_.resize(count * sample_bytes());
        in_->read(count, tmp_.data());
        auto* out = static_cast<std::uint8_t*>(dst);
        const std::uint64_t plane = h_ * w_;
        for (std::uint64_t s = 0; s < count; ++s) {
            const std::uint8_t* src = tmp_.data() + s * sample_bytes();
            std::uint8_t* o = out + s * sample_bytes();
            for (std::uint64_t p = 0; p < plane; ++p)
                for (std::uint64_t c = 0; c < c_; ++c)
                    std::memcpy(o + (c * plane + p) * elem_, src + (p * c_ + c) * elem_, elem_);
        }
    }
    void skip(std::uint64_t count) override { in_->skip(count); }
    std::uint64_t sample_bytes() const override { return h_ * w_ * c_ * elem_; }
    void expect_end() override { in_->expect_end(); }

  private:
    std::unique_ptr<FieldStream> in_;
    std::uint64_t h_, w_, c_;
    std::size_t elem_;
    std::vector<std::uint8_t> tmp_;
};

bool channel_count(std::uint64_t n) {
    return n == 1 || n == 3 || n == 4;
}

// --in-layout: images of the array formats stored HWC become CHW, the layout
// dstk's models read; only the input field is images.
void apply_in_layout(Source& s, InputFormat format, InLayout layout) {
    if (layout == InLayout::nchw) return;
    const bool arrays = format == InputFormat::npy || format == InputFormat::npz || format == InputFormat::raw;
    if (layout == InLayout::automatic && format == InputFormat::raw) return; // --shape says what the user means
    if (!arrays) {
        if (layout == InLayout::nhwc)
            throw usage_error("--in-layout nhwc applies to npy, npz and raw inputs; " +
                              std::string(input_format_name(format)) + " inputs have their own layout");
        return;
    }
    if (s.input_field.empty() && layout == InLayout::nhwc)
        throw usage_error("--in-layout nhwc applies to the input field, and the input names none; give --input NAME");
    for (auto& sp : s.splits)
        for (auto& f : sp.fields) {
            if (f.name != s.input_field) continue;
            const auto& d = f.shape.dims;
            const bool hwc = d.size() == 3 && channel_count(d[2]) && !channel_count(d[0]) && !channel_count(d[1]);
            if (layout == InLayout::nhwc && d.size() != 3)
                throw usage_error("--in-layout nhwc needs samples of 3 dimensions (height x width x channels); " +
                                  f.name + " has shape " + f.shape.str());
            if (layout == InLayout::automatic && !hwc) continue;
            const Shape chw{{d[2], d[0], d[1]}};
            if (layout == InLayout::automatic && &sp == &s.splits.front())
                s.notices.push_back(f.name + ": samples of shape " + f.shape.str() +
                                    " read as height x width x channels and transposed to " + chw.str() +
                                    " (give --in-layout nchw if they are not images with channels last)");
            f.stream = std::make_unique<HwcToChwField>(std::move(f.stream), f.shape, dtype_size(f.dtype));
            f.shape = chw;
        }
}

// The roles: --input/--label where given (the array formats resolve them
// themselves, by member name too), else the format's own; a role that names
// no field of the input is dropped (npy images without labels have no y).
void apply_roles(Source& s, const RawInputOptions& raw, const std::filesystem::path& path) {
    const SourceSplit& first = s.splits.front();
    auto has = [&](const std::string& name) {
        for (const auto& f : first.fields)
            if (f.name == name) return true;
        return false;
    };
    for (auto [role, given, flag] :
         {std::tuple{&s.input_field, &raw.input, "--input"}, std::tuple{&s.label_field, &raw.label, "--label"}}) {
        if (!given->empty() && !s.roles_applied) {
            if (!has(*given)) {
                std::string names;
                for (const auto& f : first.fields) names += (names.empty() ? "" : ", ") + f.name;
                throw usage_error(std::string(flag) + " " + *given + ": '" + path.string() +
                                  "' has no such field (it has: " + names + ")");
            }
            *role = *given;
        }
        if (!has(*role)) role->clear();
    }
    if (!s.input_field.empty() && s.input_field == s.label_field)
        throw usage_error("--input and --label name the same field '" + s.input_field +
                          "'; a field has one role at most");
}

// What every format must give, checked once for all of them: names that
// can be file names (an .npz member '../x.npy' must not write outside
// OUTPUT) and samples of at least one element (a 0-sized sample has no
// channels to average and makes a dataset its readers refuse).
void check_source(const Source& s, const fs::path& path) {
    const std::string where = "'" + path.string() + "'";
    for (const auto& sp : s.splits) {
        if (const std::string why = name_problem("split", sp.name); !why.empty())
            throw runtime_error(where + ": the input's " + why + "; rename it in the input");
        for (const auto& f : sp.fields) {
            if (const std::string why = name_problem("field", f.name); !why.empty())
                throw runtime_error(where + ": the input's " + why + "; rename it in the input");
            for (const std::uint64_t d : f.shape.dims)
                if (d == 0)
                    throw runtime_error(where + ": field " + f.name + " has samples of shape " + f.shape.str() +
                                        ", which hold no element (a dimension is 0); give an input whose samples "
                                        "hold at least one value");
        }
    }
}

} // namespace

void FieldStream::skip(std::uint64_t count) {
    std::vector<std::uint8_t> scratch;
    const std::uint64_t per = std::max<std::uint64_t>(1, io_block / std::max<std::uint64_t>(1, sample_bytes()));
    while (count > 0) {
        const std::uint64_t n = std::min(count, per);
        scratch.resize(n * sample_bytes());
        read(n, scratch.data());
        count -= n;
    }
}

constexpr EnumNames<InputFormat, 8> input_format_names{{{{InputFormat::automatic, "auto"},
                                                         {InputFormat::dataset, "dataset"},
                                                         {InputFormat::npy, "npy"},
                                                         {InputFormat::npz, "npz"},
                                                         {InputFormat::raw, "raw"},
                                                         {InputFormat::v28b, "v28b"},
                                                         {InputFormat::idx, "idx"},
                                                         {InputFormat::cifar10, "cifar10"}}}};

std::string_view input_format_name(InputFormat f) {
    return input_format_names.name(f);
}

InputFormat parse_input_format(std::string_view name) {
    return input_format_names.parse(name, "--from");
}

constexpr EnumNames<InLayout, 3> in_layout_names{
    {{{InLayout::automatic, "auto"}, {InLayout::nhwc, "nhwc"}, {InLayout::nchw, "nchw"}}}};

InLayout parse_in_layout(std::string_view text) {
    return in_layout_names.parse(text, "--in-layout");
}

void byteswap_elements(void* data, std::uint64_t count, std::size_t elem_bytes) {
    auto* p = static_cast<std::uint8_t*>(data);
    for (std::uint64_t i = 0; i < count; ++i, p += elem_bytes) std::reverse(p, p + elem_bytes);
}

Source open_source(const fs::path& path, InputFormat format, const RawInputOptions& raw, ThreadPool& pool) {
    // stdin cannot be sniffed and put back: IDX unless the user described raw samples.
    if (format == InputFormat::automatic && path == "-" && (raw.shape || raw.dtype)) format = InputFormat::raw;
    if (format == InputFormat::automatic) format = detect_format(path);
    Source s = open_format(path, format, raw, pool);
    check_source(s, path);
    apply_roles(s, raw, path);
    apply_in_layout(s, format, raw.in_layout);
    return s;
}

namespace {

Source open_format(const fs::path& path, InputFormat format, const RawInputOptions& raw, ThreadPool& pool) {
    if (path == "-" && format != InputFormat::idx && format != InputFormat::raw)
        throw usage_error("stdin ('-') can only be read as raw or IDX (--from raw|idx)");
    if (raw.shape && format != InputFormat::raw && format != InputFormat::v28b)
        throw usage_error("--shape describes raw and v28b inputs only; '" + path.string() + "' is " +
                          std::string(input_format_name(format)));
    if (!raw.labels.empty()) {
        const bool idx_dir = format == InputFormat::idx && path != "-" && fs::is_directory(path);
        if (format == InputFormat::dataset || format == InputFormat::v28b || format == InputFormat::cifar10 || idx_dir)
            throw usage_error("--labels gives the labels of an image array (npy, npz, raw or IDX file); '" +
                              path.string() + "' is " + std::string(input_format_name(format)) +
                              ", which carries its own labels");
        if (raw.labels == "-" && path == "-") throw usage_error("--labels - : stdin already carries the images");
        Source s = format == InputFormat::raw   ? open_raw(path, raw)
                   : format == InputFormat::npy ? open_npy(path, raw)
                   : format == InputFormat::npz ? open_npz(path, raw)
                                                : open_idx_file(path);
        attach_labels(s, path, raw);
        return s;
    }
    switch (format) {
    case InputFormat::dataset:
        return open_dataset_dir(path, pool);
    case InputFormat::npy:
        return open_npy(path, raw);
    case InputFormat::npz:
        return open_npz(path, raw);
    case InputFormat::raw:
        return open_raw(path, raw);
    case InputFormat::v28b:
        return open_v28b(path, raw);
    case InputFormat::idx:
        return path != "-" && fs::is_directory(path) ? open_idx_dir(path) : open_idx_file(path);
    case InputFormat::cifar10:
        return open_cifar(path);
    case InputFormat::automatic:
        break;
    }
    throw usage_error("cannot tell the format of '" + path.string() + "'; give --from");
}

} // namespace

} // namespace dstk
