#include "dstk/dataset_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "dstk/fd.hpp"
#include "dstk/error.hpp"
#include "dstk/npy.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {

NpyFieldWriter::NpyFieldWriter(fs::path path, std::string file_name, std::string field, DType dtype, Shape shape,
                               std::uint64_t samples)
    : path_(std::move(path)), samples_(samples) {
    info_.name = std::move(field);
    info_.dtype = dtype;
    info_.shape = std::move(shape);
    info_.storage = Storage::npy;
    info_.file = std::move(file_name);
    std::vector<std::uint64_t> dims{samples};
    dims.insert(dims.end(), info_.shape.dims.begin(), info_.shape.dims.end());
    const std::string header = make_npy_header(dtype, dims);
    info_.bytes = checked_add(header.size(), checked_sample_total(info_, samples), "file size");
    fd_ = UniqueFd::open(path_, O_WRONLY | O_CREAT | O_TRUNC, "create");
    write_all(fd_.get(), header.data(), header.size(), -1, path_);
    hash_.update(header.data(), header.size());
}

NpyFieldWriter::~NpyFieldWriter() = default;

void NpyFieldWriter::append(const void* data, std::uint64_t count) {
    if (count > samples_ - written_)
        throw runtime_error("internal: more samples written to '" + path_.string() + "' than declared");
    const std::uint64_t bytes = count * info_.sample_bytes();
    write_all(fd_.get(), data, bytes, -1, path_);
    hash_.update(data, bytes);
    written_ += count;
}

FieldInfo NpyFieldWriter::finish() {
    if (written_ != samples_)
        throw runtime_error("internal: '" + path_.string() + "' got " + std::to_string(written_) + " of " +
                            std::to_string(samples_) + " samples");
    if (::close(fd_.release()) != 0) throw_errno("cannot close", path_.string());
    info_.checksum = hash_.hex();
    return info_;
}

DatasetWriter::DatasetWriter(fs::path out_dir, bool force) : dir_(std::move(out_dir), force) {}

std::unique_ptr<NpyFieldWriter> DatasetWriter::npy_field(const std::string& split, const std::string& field,
                                                         DType dtype, const Shape& shape, std::uint64_t samples) {
    const std::string name = field_file_name(split, field, ".npy");
    return std::make_unique<NpyFieldWriter>(dir_.file(name), name, field, dtype, shape, samples);
}

void DatasetWriter::write_manifest(const Manifest& manifest) {
    const std::string text = serialize_manifest(manifest);
    const fs::path path = dir_.file(manifest_file_name);
    const UniqueFd fd = UniqueFd::open(path, O_WRONLY | O_CREAT | O_TRUNC, "create");
    write_all(fd.get(), text.data(), text.size(), -1, path);
}

void DatasetWriter::commit(const Manifest& manifest) {
    write_manifest(manifest);
    dir_.commit();
}

} // namespace dstk
