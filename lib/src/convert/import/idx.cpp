// MNIST IDX files (plain or gzip), a file, stdin, or a directory of images/labels pairs.
#include "formats.hpp"

#include <map>

namespace dstk::import {

// ---- IDX ------------------------------------------------------------------

std::unique_ptr<GzStream> open_idx_stream(const fs::path& path) {
    if (path == "-") return std::make_unique<GzStream>(STDIN_FILENO, "<stdin>", false);
    UniqueFd fd = open_input_file(path, "input");
    return std::make_unique<GzStream>(fd.release(), path.string(), true); // gzclose closes it
}

IdxHeader read_idx_header(GzStream& in, const std::string& source) {
    std::uint8_t head[4 + 4 * 255];
    in.read(head, 4);
    (void)parse_idx_header({head, 4}, source); // the magic, before trusting the dimension count
    const unsigned ndim = head[3];
    in.read(head + 4, 4ull * ndim);
    return parse_idx_header({head, 4 + 4ull * ndim}, source);
}

// Labels are small: loaded whole and widened to i32.
std::vector<std::uint8_t> load_idx_labels(const fs::path& path, std::uint64_t& samples, std::uint32_t& classes) {
    auto in = open_idx_stream(path);
    const IdxHeader h = read_idx_header(*in, path.string());
    if (h.dtype != DType::u8 || h.dims.size() != 1)
        bad_input(path.string(), "is not an IDX label file (expected 1-d unsigned bytes)");
    samples = h.dims[0];
    std::vector<std::uint8_t> raw(samples);
    in->read(raw.data(), samples);
    if (!in->at_end()) bad_input(path.string(), "has data after its " + std::to_string(samples) + " labels");
    std::vector<std::uint8_t> out(samples * 4);
    std::uint32_t top = 0;
    for (std::uint64_t i = 0; i < samples; ++i) {
        const std::int32_t v = raw[i];
        top = std::max<std::uint32_t>(top, raw[i]);
        std::memcpy(out.data() + 4 * i, &v, 4);
    }
    classes = samples ? top + 1 : 0;
    return out;
}

SourceField idx_images(const fs::path& path, std::uint64_t& samples) {
    auto in = open_idx_stream(path);
    const IdxHeader h = read_idx_header(*in, path.string());
    SourceField sf;
    sf.name = "x";
    sf.dtype = h.dtype;
    sf.shape = sample_shape(h.dims, path.string());
    if (sf.shape.dims.size() == 2) sf.shape.dims.insert(sf.shape.dims.begin(), 1); // HxW images as 1xHxW
    samples = h.dims[0];
    (void)checked_mul(samples, sample_bytes(sf.shape, sf.dtype), "IDX data size");
    sf.stream = std::make_unique<BytesField>(std::move(in), sample_bytes(sf.shape, sf.dtype),
                                             is_little_endian() ? dtype_size(h.dtype) : 0);
    return sf;
}

bool idx_name(const std::string& file, std::string& prefix, bool& images) {
    for (const char* kind : {"-images", "-labels"}) {
        const auto at = file.find(kind);
        if (at != std::string::npos && file.find("idx", at) != std::string::npos) {
            prefix = file.substr(0, at);
            images = std::string(kind) == "-images";
            return true;
        }
    }
    return false;
}

Source open_idx_dir(const fs::path& dir) {
    std::map<std::string, std::pair<fs::path, fs::path>> pairs; // prefix -> (images, labels)
    for (const auto& e : fs::directory_iterator(dir)) {
        std::string prefix;
        bool images = false;
        if (!e.is_regular_file() || !idx_name(e.path().filename().string(), prefix, images)) continue;
        (images ? pairs[prefix].first : pairs[prefix].second) = e.path();
    }
    Source s;
    s.format = InputFormat::idx;
    s.description = "MNIST-style IDX files";
    std::uint32_t classes = 0;
    for (const auto& [prefix, p] : pairs) {
        if (p.first.empty()) continue;
        SourceSplit split;
        split.name = split_for_prefix(prefix);
        split.fields.push_back(idx_images(p.first, split.samples));
        if (!p.second.empty()) {
            std::uint64_t labels = 0;
            std::uint32_t c = 0;
            auto data = load_idx_labels(p.second, labels, c);
            if (labels != split.samples)
                bad_input(p.second.string(), "has " + std::to_string(labels) + " labels but " +
                                                 p.first.filename().string() + " has " + std::to_string(split.samples) +
                                                 " images");
            classes = std::max(classes, c);
            SourceField y;
            y.name = "y";
            y.dtype = DType::i32;
            y.stream = std::make_unique<MemoryField>(std::move(data), 4);
            split.fields.push_back(std::move(y));
        }
        s.splits.push_back(std::move(split));
    }
    if (s.splits.empty()) bad_input(dir.string(), "holds no *-images-idx*-ubyte[.gz] files");
    // train before test, as a user lists them.
    std::stable_sort(s.splits.begin(), s.splits.end(), [](const SourceSplit& a, const SourceSplit& b) {
        return (a.name == "train") > (b.name == "train");
    });
    if (classes) s.num_classes = classes;
    return s;
}

Source open_idx_file(const fs::path& path) {
    Source s;
    s.format = InputFormat::idx;
    s.description = "IDX file";
    s.rereadable = path != "-";
    std::string prefix;
    bool images = true;
    SourceSplit split;
    split.name = idx_name(path.filename().string(), prefix, images) ? split_for_prefix(prefix) : "train";
    split.fields.push_back(idx_images(path, split.samples));
    s.splits.push_back(std::move(split));
    return s;
}

// An IDX file (plain or gzip) by its first bytes: gzip's magic, or IDX's
// two zero bytes and a known element type.
bool looks_like_idx(const fs::path& path) {
    const File f(path);
    if (f.bytes < 4) return false;
    const auto head = f.read_at(0, 4);
    if (head[0] == 0x1f && head[1] == 0x8b) return true;
    return head[0] == 0 && head[1] == 0 && (head[2] == 0x08 || head[2] == 0x09 || (head[2] >= 0x0B && head[2] <= 0x0E));
}

namespace {

// Every sample of the single scalar field of a labels source, in memory.
SourceField labels_in_memory(Source src, const fs::path& labels, std::uint64_t& count) {
    std::size_t arrays = 0;
    for (const auto& sp : src.splits) arrays += sp.fields.size();
    if (arrays != 1)
        bad_input(labels.string(), "holds " + std::to_string(arrays) +
                                       " arrays; a --labels file holds one (the labels of the images, in order)");
    SourceSplit& sp = src.splits.front();
    SourceField& f = sp.fields.front();
    if (f.shape.numel() != 1)
        bad_input(labels.string(), "holds samples of shape " + f.shape.str() + "; labels are one value per sample");
    count = sp.samples;
    std::vector<std::uint8_t> data(checked_mul(count, dtype_size(f.dtype), "labels size"));
    f.stream->read(count, data.data());
    SourceField y;
    y.name = "y";
    y.dtype = f.dtype;
    y.stream = std::make_unique<MemoryField>(std::move(data), dtype_size(f.dtype));
    return y;
}

// A raw labels file: --label-dtype elements, one per sample.
Source raw_labels(const fs::path& labels, DType dtype) {
    auto f = std::make_shared<File>(labels);
    Source s;
    SourceSplit sp;
    sp.name = "train";
    sp.samples = whole_samples(*f, dtype_size(dtype), "labels");
    sp.fields.push_back(raw_field(f, "y", dtype, Shape{}, Layout::sample_major, sp.samples));
    s.splits.push_back(std::move(sp));
    return s;
}

} // namespace

// --labels FILE: field y of a single-split source: .npy, .npz (one array),
// IDX (plain or gzip; stdin '-') or raw (--label-dtype). Images from stdin
// take their split name from an IDX-style label file name
// (t10k-labels-idx1-ubyte.gz: test).
void attach_labels(Source& s, const fs::path& images, const RawInputOptions& raw) {
    const fs::path& labels = raw.labels;
    if (s.splits.size() != 1)
        throw usage_error("--labels gives the labels of one set of images; '" + images.string() + "' has " +
                          std::to_string(s.splits.size()) + " splits");
    SourceSplit& split = s.splits.front();
    for (const auto& f : split.fields)
        if (f.name == "y" || f.name == s.label_field)
            throw usage_error("--labels: '" + images.string() + "' already holds labels (field " + f.name +
                              "); drop --labels");
    std::string prefix;
    bool is_images = false;
    if (images == "-" && idx_name(labels.filename().string(), prefix, is_images) && !is_images)
        split.name = split_for_prefix(prefix);
    std::uint64_t count = 0;
    SourceField y;
    const std::string ext = lower(labels.extension().string());
    if (labels != "-" && (ext == ".npy" || ext == ".npz")) {
        y = labels_in_memory(ext == ".npy" ? open_npy(labels, RawInputOptions{}) : open_npz(labels, RawInputOptions{}),
                             labels, count);
    } else if (labels == "-" || looks_like_idx(labels)) {
        std::uint32_t classes = 0;
        y.name = "y";
        y.dtype = DType::i32;
        y.stream = std::make_unique<MemoryField>(load_idx_labels(labels, count, classes), 4);
        if (classes) s.num_classes = classes;
    } else {
        y = labels_in_memory(raw_labels(labels, raw.label_dtype), labels, count);
    }
    if (!split.count_known) {
        split.samples = count; // stdin images: the labels give the count
        split.count_known = true;
    } else if (count != split.samples) {
        bad_input(labels.string(), "has " + std::to_string(count) + " labels but the images have " +
                                       std::to_string(split.samples) + " samples");
    }
    split.fields.push_back(std::move(y));
    s.label_field = "y";
}

} // namespace dstk::import

namespace dstk {

using namespace import;

IdxHeader parse_idx_header(std::span<const std::uint8_t> bytes, const std::string& source) {
    if (bytes.size() < 4) bad_input(source, "too short for an IDX header");
    if (bytes[0] != 0 || bytes[1] != 0)
        bad_input(source, "wrong magic (an IDX file starts with two zero bytes; is it gzipped or another format?)");
    IdxHeader h;
    switch (bytes[2]) {
    case 0x08:
        h.dtype = DType::u8;
        break;
    case 0x09:
        h.dtype = DType::i8;
        break;
    case 0x0B:
        h.dtype = DType::i16;
        break;
    case 0x0C:
        h.dtype = DType::i32;
        break;
    case 0x0D:
        h.dtype = DType::f32;
        break;
    case 0x0E:
        h.dtype = DType::f64;
        break;
    default:
        bad_input(source, "unknown IDX element type 0x" + std::to_string(bytes[2]));
    }
    const unsigned ndim = bytes[3];
    if (ndim == 0) bad_input(source, "IDX header has no dimensions");
    if (bytes.size() == 4) return h; // magic only: the caller reads the dimensions next
    if (bytes.size() < 4 + 4ull * ndim) bad_input(source, "IDX header is cut short");
    std::uint64_t total = dtype_size(h.dtype);
    for (unsigned k = 0; k < ndim; ++k) {
        h.dims.push_back(be32(bytes.data() + 4 + 4 * k));
        if (h.dims.back() == 0 && k > 0) bad_input(source, "IDX dimension " + std::to_string(k) + " is 0");
        if (h.dims.back() != 0 && total > (std::uint64_t{1} << 62) / h.dims.back())
            bad_input(source, "IDX dimensions overflow");
        total *= std::max<std::uint64_t>(1, h.dims.back());
    }
    h.data_offset = 4 + 4ull * ndim;
    return h;
}

} // namespace dstk
