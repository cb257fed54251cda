// .npy files: C or Fortran order, either byte order.
#include "formats.hpp"

namespace dstk::import {

// ---- .npy -------------------------------------------------------------

// The C-order-to-Fortran feature permutation of a per-sample shape.
std::vector<std::uint64_t> fortran_feature_order(const Shape& s) {
    if (s.dims.size() <= 1) return {};
    const std::uint64_t n = s.numel();
    std::vector<std::uint64_t> order(n);
    std::vector<std::uint64_t> idx(s.dims.size(), 0);
    for (std::uint64_t c = 0; c < n; ++c) {
        std::uint64_t f = 0, stride = 1;
        for (std::size_t k = 0; k < idx.size(); ++k) {
            f += idx[k] * stride;
            stride *= s.dims[k];
        }
        order[c] = f;
        for (std::size_t k = idx.size(); k-- > 0;) {
            if (++idx[k] < s.dims[k]) break;
            idx[k] = 0;
        }
    }
    return order;
}

SourceField npy_field_from(std::shared_ptr<File> f, const NpyHeader& h, std::uint64_t offset, std::string name,
                           const std::string& source) {
    SourceField sf;
    sf.name = std::move(name);
    sf.dtype = h.dtype;
    sf.shape = sample_shape(h.shape, source);
    const std::uint64_t samples = h.shape[0];
    const std::uint64_t sb = sample_bytes(sf.shape, sf.dtype);
    if (checked_add(offset, h.data_bytes(), "file size") > f->bytes)
        bad_input(source, "header says " + std::to_string(h.data_bytes()) + " bytes of data (shape " +
                              Shape{h.shape}.str() + " of " + h.descr + ") but the file holds " +
                              std::to_string(f->bytes - std::min(f->bytes, offset)) + " (file truncated?)");
    const std::size_t swap = h.big_endian == is_little_endian() ? dtype_size(h.dtype) : 0;
    if (h.fortran_order && samples > 1 && sf.shape.numel() > 1)
        sf.stream = std::make_unique<FeatureMajorField>(f, offset, samples, sf.shape.numel(), dtype_size(h.dtype), swap,
                                                        fortran_feature_order(sf.shape));
    else
        sf.stream =
            std::make_unique<BytesField>(std::make_unique<FileRegion>(f, offset, offset + samples * sb), sb, swap);
    return sf;
}

namespace {

// The header of a whole .npy file, checked against the file's size.
NpyHeader whole_npy_header(const File& f) {
    const NpyHeader h = read_npy_header_fd(f.fd, f.path.string());
    if (h.data_offset + h.data_bytes() != f.bytes)
        bad_input(f.path.string(), "header (shape " + Shape{h.shape}.str() + " of " + h.descr + ", " +
                                       std::to_string(h.data_bytes()) + " bytes) disagrees with the file size (" +
                                       std::to_string(f.bytes - std::min(f.bytes, h.data_offset)) +
                                       " data bytes; file truncated?)");
    if (h.shape.empty()) bad_input(f.path.string(), "a 0-d array has no samples (need at least one dimension)");
    return h;
}

// A directory of .npy files: one field per file, named by the file.
Source open_npy_dir(const fs::path& dir, const RawInputOptions& raw) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
        if (ends_with(e.path().filename().string(), ".npy")) files.push_back(e.path());
    std::sort(files.begin(), files.end()); // the fields' order, whatever the directory's
    std::vector<NamedArray> arrays;
    for (const fs::path& p : files) {
        auto f = std::make_shared<File>(p);
        const NpyHeader h = whole_npy_header(*f);
        const std::string member = p.stem().string();
        arrays.push_back({member, npy_field_from(f, h, h.data_offset, member, p.string()), h.shape[0]});
    }
    Source s = source_from_arrays(std::move(arrays), raw, dir.string());
    s.format = InputFormat::npy;
    s.description = "directory of .npy files";
    return s;
}

} // namespace

Source open_npy(const fs::path& path, const RawInputOptions& raw) {
    if (path != "-" && fs::is_directory(path)) return open_npy_dir(path, raw);
    auto f = std::make_shared<File>(path);
    const NpyHeader h = whole_npy_header(*f);
    Source s;
    s.format = InputFormat::npy;
    s.description = ".npy file";
    SourceSplit split;
    split.name = "train";
    split.fields.push_back(npy_field_from(f, h, h.data_offset, "x", path.string()));
    split.samples = h.shape[0];
    s.splits.push_back(std::move(split));
    s.label_field.clear();
    return s;
}

} // namespace dstk::import
