// The seeds' v28b layout: images_<split>.bin (feature-major) + labels_<split>.bin.
#include "formats.hpp"

namespace dstk::import {

Source open_v28b(const fs::path& dir, const RawInputOptions& raw) {
    if (!raw.shape)
        throw usage_error("v28b input '" + dir.string() +
                          "' needs --shape (the per-sample shape of images_*.bin, e.g. --shape 3x32x32)");
    const DType dtype = raw.dtype.value_or(DType::f32);
    Source s;
    s.format = InputFormat::v28b;
    s.description = "v28b feature-major .bin files";
    std::vector<fs::path> images;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("images_", 0) == 0 && ends_with(n, ".bin")) images.push_back(e.path());
    }
    std::sort(images.begin(), images.end());
    if (images.empty()) bad_input(dir.string(), "holds no images_*.bin files");
    for (const fs::path& ip : images) {
        const std::string stem = ip.filename().string().substr(7, ip.filename().string().size() - 11);
        const fs::path lp = dir / ("labels_" + stem + ".bin");
        if (!fs::exists(lp)) bad_input(ip.string(), "has no matching " + lp.filename().string());
        auto lf = std::make_shared<File>(lp);
        auto imf = std::make_shared<File>(ip);
        SourceSplit split;
        split.name = split_for_prefix(stem);
        split.samples = whole_samples(*lf, dtype_size(raw.label_dtype), "labels");
        const std::uint64_t want = checked_mul(split.samples, sample_bytes(*raw.shape, dtype), "image bytes");
        if (imf->bytes != want)
            bad_input(ip.string(), "has " + std::to_string(imf->bytes) + " bytes but " + std::to_string(split.samples) +
                                       " labels of " + raw.shape->str() + " " + std::string(dtype_name(dtype)) +
                                       " images need " + std::to_string(want) +
                                       " (wrong --shape/--in-dtype, or a file truncated?)");
        split.fields.push_back(raw_field(imf, "x", dtype, *raw.shape, Layout::feature_major, split.samples));
        split.fields.push_back(raw_field(lf, "y", raw.label_dtype, Shape{}, Layout::sample_major, split.samples));
        s.splits.push_back(std::move(split));
    }
    return s;
}

} // namespace dstk::import
