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

Source open_npy(const fs::path& path) {
    auto f = std::make_shared<File>(path);
    const NpyHeader h = read_npy_header_fd(f->fd, path.string());
    if (h.data_offset + h.data_bytes() != f->bytes)
        bad_input(path.string(), "header (shape " + Shape{h.shape}.str() + " of " + h.descr + ", " +
                                     std::to_string(h.data_bytes()) + " bytes) disagrees with the file size (" +
                                     std::to_string(f->bytes - std::min(f->bytes, h.data_offset)) +
                                     " data bytes; file truncated?)");
    Source s;
    s.format = InputFormat::npy;
    s.description = ".npy file";
    SourceSplit split;
    split.name = "train";
    split.fields.push_back(npy_field_from(f, h, h.data_offset, "x", path.string()));
    split.samples = h.shape.empty() ? 0 : h.shape[0];
    s.splits.push_back(std::move(split));
    return s;
}

} // namespace dstk::import
