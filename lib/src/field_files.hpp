#pragma once
// The files of one field of one split, as the manifest describes them: the
// field's one file, or its parts (FieldInfo::parts) in sample order. What the
// field's readers share: the immutable FieldReader (field_reader.cpp) and the
// stream placement's own StreamReader (data/stream_reader*.cpp), each of
// which opens the files itself and checks them against the manifest with the
// same messages.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dstk/chunked_file.hpp"
#include "dstk/fd.hpp"
#include "dstk/manifest.hpp"

namespace dstk {

// "; re-create the dataset (dsgen/dsconvert) or restore the file": the fix of every mismatch.
extern const std::string redo_dataset;

// One file of a field: the whole field, or one of its parts, with what the
// manifest says of it and where its samples start in the field.
struct FileSpec {
    std::filesystem::path path;
    std::string where; // the path, and for a part which part of which field
    std::uint64_t first = 0, samples = 0, bytes = 0;
    std::string checksum;
};

// The field's files in sample order; a runtime error where the parts do not
// add up to the split's samples.
std::vector<FileSpec> field_files(const std::filesystem::path& dir, const SplitInfo& split, const FieldInfo& field);

// Opens one file of a field; a missing part is named as such.
UniqueFd open_field_file(const FileSpec& f, int flags);
// The file's size against the manifest's.
void check_file_bytes(std::uint64_t size, const FileSpec& f);
// For readers that open the file through another parser: the errors
// open_field_file and check_file_bytes give, before that parser reads a
// truncated tail.
void require_file(const FileSpec& f);
// Size and checksum of one file against the manifest, re-reading it.
void verify_file(const FileSpec& f);
// An .npy file of the field (open on fd) against the manifest: size, dtype,
// order, shape; returns the offset of its data.
std::uint64_t validate_npy_file(int fd, const FileSpec& f, const FieldInfo& field);
// A zstd-chunked file of the field opened, its chunk index checked against
// the manifest (samples, sample bytes, chunk).
std::unique_ptr<ChunkedReader> open_chunked_part(const FileSpec& f, const FieldInfo& field);

// The walk of a range of samples over the files of a field.
class FilePieces {
  public:
    explicit FilePieces(std::vector<FileSpec> files) : files_(std::move(files)) {}
    const std::vector<FileSpec>& files() const { return files_; }
    std::size_t size() const { return files_.size(); }
    const FileSpec& operator[](std::size_t i) const { return files_[i]; }

    // fn(file, first sample in the file, samples, samples of the range before
    // them) for each file that [first, first + count) touches, in order.
    template <class Fn> void each(std::uint64_t first, std::uint64_t count, Fn&& fn) const {
        std::size_t i = file_of(first);
        std::uint64_t done = 0;
        while (done < count) {
            const FileSpec& f = files_[i];
            const std::uint64_t in = first + done - f.first, n = std::min(count - done, f.samples - in);
            if (n > 0) fn(i, in, n, done);
            done += n;
            ++i;
        }
    }
    std::size_t file_of(std::uint64_t sample) const {
        const auto it = std::upper_bound(files_.begin(), files_.end(), sample,
                                         [](std::uint64_t s, const FileSpec& f) { return s < f.first; });
        return static_cast<std::size_t>(it - files_.begin()) - 1;
    }

  private:
    std::vector<FileSpec> files_;
};

} // namespace dstk
