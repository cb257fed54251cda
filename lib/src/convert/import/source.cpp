// The input of dsconvert: its format detected (or given), then opened by
// the format's opener.
#include "formats.hpp"

#include "dstk/enum_names.hpp"

namespace dstk {
namespace {

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
        throw usage_error("cannot tell the format of directory '" + path.string() +
                          "' (no dataset.json, CIFAR-10 batches, v28b or IDX files); give --from");
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

void byteswap_elements(void* data, std::uint64_t count, std::size_t elem_bytes) {
    auto* p = static_cast<std::uint8_t*>(data);
    for (std::uint64_t i = 0; i < count; ++i, p += elem_bytes) std::reverse(p, p + elem_bytes);
}

Source open_source(const fs::path& path, InputFormat format, const RawInputOptions& raw, ThreadPool& pool) {
    // stdin cannot be sniffed and put back: IDX unless the user described raw samples.
    if (format == InputFormat::automatic && path == "-" && (raw.shape || raw.dtype)) format = InputFormat::raw;
    if (format == InputFormat::automatic) format = detect_format(path);
    if (path == "-" && format != InputFormat::idx && format != InputFormat::raw)
        throw usage_error("stdin ('-') can only be read as raw or IDX (--from raw|idx)");
    if (raw.shape && format != InputFormat::raw && format != InputFormat::v28b)
        throw usage_error("--shape describes raw and v28b inputs only; '" + path.string() + "' is " +
                          std::string(input_format_name(format)));
    if (!raw.labels.empty()) {
        const bool idx_file = format == InputFormat::idx && (path == "-" || !fs::is_directory(path));
        if (format != InputFormat::raw && !idx_file)
            throw usage_error("--labels gives the labels of raw or IDX-file images; '" + path.string() + "' is " +
                              std::string(input_format_name(format)) +
                              (format == InputFormat::idx ? " (a directory pairs its own label files)" : ""));
        if (raw.labels == "-" && path == "-") throw usage_error("--labels - : stdin already carries the images");
        Source s = format == InputFormat::raw ? open_raw(path, raw) : open_idx_file(path);
        attach_labels(s, path, raw.labels);
        return s;
    }
    switch (format) {
    case InputFormat::dataset:
        return open_dataset_dir(path, pool);
    case InputFormat::npy:
        return open_npy(path);
    case InputFormat::npz:
        return open_npz(path);
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

} // namespace dstk
