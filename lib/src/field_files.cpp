#include "field_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/npy.hpp"

namespace fs = std::filesystem;

namespace dstk {

const std::string redo_dataset = "; re-create the dataset (dsgen/dsconvert) or restore the file";

std::vector<FileSpec> field_files(const fs::path& dir, const SplitInfo& split, const FieldInfo& field) {
    if (field.parts.empty())
        return {FileSpec{dir / field.file, (dir / field.file).string(), 0, split.samples, field.bytes, field.checksum}};
    std::vector<FileSpec> files;
    std::uint64_t first = 0;
    for (std::size_t i = 0; i < field.parts.size(); ++i) {
        const FieldPart& p = field.parts[i];
        const fs::path path = dir / p.file;
        files.push_back({path,
                         path.string() + " (part " + std::to_string(i + 1) + " of " +
                             std::to_string(field.parts.size()) + " of field '" + field.name + "' of split '" +
                             split.name + "')",
                         first, p.samples, p.bytes, p.checksum});
        first += p.samples;
    }
    if (first != split.samples)
        throw runtime_error((dir / manifest_file_name).string() + ": the parts of field '" + field.name +
                            "' of split '" + split.name + "' hold " + std::to_string(first) +
                            " samples but the split has " + std::to_string(split.samples) +
                            " (manifest edited or a part list incomplete?); re-run dsconvert --merge");
    return files;
}

UniqueFd open_field_file(const FileSpec& f, int flags) {
    UniqueFd fd = try_open_input_file(f.path, "dataset file", flags & ~O_ACCMODE);
    if (!fd)
        throw runtime_error("cannot open dataset file " + f.where + " (" + std::strerror(errno) +
                            "); restore the file or re-create the dataset");
    return fd;
}

void check_file_bytes(std::uint64_t size, const FileSpec& f) {
    if (size != f.bytes)
        throw runtime_error(f.where + ": file has " + std::to_string(size) + " bytes but " + manifest_file_name +
                            " says " + std::to_string(f.bytes) + (size < f.bytes ? " (file truncated?)" : "") +
                            redo_dataset);
}

void require_file(const FileSpec& f) {
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0)
        throw runtime_error("cannot open dataset file " + f.where + " (" + std::strerror(errno) +
                            "); restore the file or re-create the dataset");
    require_regular_file(st.st_mode, f.path, "dataset file");
    check_file_bytes(static_cast<std::uint64_t>(st.st_size), f);
}

void verify_file(const FileSpec& f) {
    std::error_code ec;
    const auto size = fs::file_size(f.path, ec);
    if (ec) throw runtime_error("cannot stat " + f.where + " (" + ec.message() + "); restore the file");
    if (size != f.bytes)
        throw runtime_error(f.where + ": file has " + std::to_string(size) + " bytes but the manifest says " +
                            std::to_string(f.bytes) + "; re-create the dataset");
    if (f.checksum.empty()) return;
    const std::string sum = file_checksum(f.path);
    if (sum != f.checksum)
        throw runtime_error(f.where + ": checksum " + sum + " does not match the manifest's " + f.checksum +
                            " (file corrupted or modified); re-create the dataset");
}

std::uint64_t validate_npy_file(int fd, const FileSpec& f, const FieldInfo& field) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("cannot stat", f.where);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    check_file_bytes(size, f);
    const NpyHeader h = read_npy_header_fd(fd, f.where);
    const bool dtype_ok = h.dtype == field.dtype || (field.dtype == DType::bf16 && h.dtype == DType::u16);
    if (!dtype_ok)
        throw runtime_error(f.where + ": .npy dtype '" + h.descr + "' disagrees with " + manifest_file_name + " (" +
                            std::string(dtype_name(field.dtype)) + ")" + redo_dataset);
    if (h.big_endian || h.fortran_order)
        throw runtime_error(f.where + ": dataset .npy files must be little-endian and C order" + redo_dataset);
    std::vector<std::uint64_t> expect{f.samples};
    expect.insert(expect.end(), field.shape.dims.begin(), field.shape.dims.end());
    if (h.shape != expect) {
        Shape got{std::vector<std::uint64_t>(h.shape.begin(), h.shape.end())};
        Shape want{expect};
        throw runtime_error(f.where + ": .npy shape " + got.str() + " disagrees with " + manifest_file_name + " (" +
                            want.str() + ": " + std::to_string(f.samples) + " samples of " + field.shape.str() + ")" +
                            redo_dataset);
    }
    const std::uint64_t data = checked_sample_total(field, f.samples);
    if (h.data_offset + data != size)
        throw runtime_error(f.where + ": header and data size disagree with the file size (" +
                            std::to_string(h.data_offset) + " + " + std::to_string(data) +
                            " != " + std::to_string(size) + ")" + redo_dataset);
    return h.data_offset;
}

} // namespace dstk
