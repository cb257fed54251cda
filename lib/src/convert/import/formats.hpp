#pragma once
// The openers of each input format (one file each in this folder) and the
// pieces they share.
#include <filesystem>
#include <memory>
#include <string>

#include "dstk/convert/importers.hpp"
#include "dstk/npy.hpp"
#include "streams.hpp"

namespace dstk {
class ThreadPool;
}

namespace dstk::import {

// A .npy file (field x), or a directory of .npy files (one field per file).
Source open_npy(const fs::path& path, const RawInputOptions& raw);
// An array of a named collection (an .npz member, a .npy file of a directory).
struct NamedArray {
    std::string member; // its name without .npy: "x_train", "positions"
    SourceField field;
    std::uint64_t samples = 0;
};
// One field per array, in the splits their names' affixes give; the roles
// from raw.input/raw.label, else from the usual names. `where` names the
// collection in messages.
Source source_from_arrays(std::vector<NamedArray> arrays, const RawInputOptions& raw, const std::string& where);
// One field of an .npy file or .npz member whose header `h` starts its data at `offset`.
SourceField npy_field_from(std::shared_ptr<File> f, const NpyHeader& h, std::uint64_t offset, std::string name,
                           const std::string& source);
Source open_npz(const fs::path& path, const RawInputOptions& raw);
Source open_raw(const fs::path& path, const RawInputOptions& raw);
SourceField raw_field(std::shared_ptr<File> f, std::string name, DType dtype, const Shape& shape, Layout layout,
                      std::uint64_t samples);
std::uint64_t whole_samples(const File& f, std::uint64_t sb, const std::string& what);
Source open_v28b(const fs::path& dir, const RawInputOptions& raw);
// "t10k-images-idx3-ubyte.gz" -> ("t10k", images); false for other names.
bool idx_name(const std::string& file, std::string& prefix, bool& images);
// An IDX file (plain or gzip), by its first bytes.
bool looks_like_idx(const fs::path& path);
Source open_idx_dir(const fs::path& dir);
Source open_idx_file(const fs::path& path);
// Adds field y from the --labels file to the images opened from `images`.
void attach_labels(Source& s, const fs::path& images, const RawInputOptions& raw);
Source open_cifar(const fs::path& path);
Source open_dataset_dir(const fs::path& dir, ThreadPool& pool);

} // namespace dstk::import
