#pragma once
// The joins of datasets that do not rewrite samples: --merge (the parts of a
// --shard run) and --concat (datasets with the same fields). Both check their
// inputs' files, place them in OUTPUT's staging directory (hard links,
// renames with --move, or, for --concat where links are impossible, copies),
// list them as the parts of each field, check the manifest and rename the
// directory into place. Nothing is lost on failure: links and copies leave
// the inputs as they were, and moved files are moved back.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "dstk/atomic_output.hpp"
#include "dstk/convert/options.hpp"
#include "dstk/manifest.hpp"

namespace dstk::join {

struct Input {
    std::filesystem::path dir;
    Manifest m;
    std::string name() const { return '\'' + dir.string() + '\''; }
};

// Usage errors for the conversion options, which a join does not apply
// (`mode`: "--merge" or "--concat"), and for an OUTPUT that is an input.
void check_options(const ConvertOptions& o, const std::vector<std::filesystem::path>& inputs, const char* mode);

// Every file of every field (one file or parts) is a regular file of the
// size the input's manifest says (the checksums are carried over, and
// dsconvert --verify re-reads them).
void check_files(const std::vector<Input>& inputs);

// "train_x.npy" -> "train_x-00001-of-00003.npy"
std::string part_file_name(const std::string& file, std::uint64_t i, std::uint64_t n);

// Files linked, moved or copied into the staging directory; moves are undone
// unless the join completes.
class Placer {
  public:
    // copy_fallback: copy where a hard link is impossible (--concat); else
    // such a failure is an error naming --move (--merge never copies).
    Placer(AtomicDir& dir, bool move, bool copy_fallback, const OutputOptions& out)
        : dir_(dir), out_(out), move_(move), copy_(copy_fallback) {}
    ~Placer();
    Placer(const Placer&) = delete;
    Placer& operator=(const Placer&) = delete;
    void place(const std::filesystem::path& from, const std::string& name);
    void done() { done_ = true; }
    std::uint64_t linked_files() const { return linked_files_; }
    std::uint64_t copied_files() const { return copied_files_; }
    std::uint64_t copied_bytes() const { return copied_bytes_; }

  private:
    void copy(const std::filesystem::path& from, const std::filesystem::path& to, int link_errno);

    AtomicDir& dir_;
    const OutputOptions& out_;
    bool move_, copy_, done_ = false;
    std::vector<std::pair<std::filesystem::path, std::filesystem::path>> moved_;
    std::uint64_t linked_files_ = 0, copied_files_ = 0, copied_bytes_ = 0;
};

// The field's files in `inputs` order (each input's file or parts, those of
// inputs with no samples in the split left out), placed under new names
// (part_file_name, input k of n) unless one file holds them all; sets the
// field's parts (or file), bytes and checksum. `samples_of(k)` is input k's
// sample count in the split, `field_of(k)` its FieldInfo (null where input k
// has no such split).
template <typename Samples, typename Field>
void place_field(FieldInfo& field, std::size_t n, Samples samples_of, Field field_of, const std::vector<Input>& inputs,
                 Placer& placer);

// Writes the manifest (checked by parsing it back: its parts add up) into
// the staging directory and renames it into place.
void commit(AtomicDir& out, const Manifest& whole);

// --move leaves each input directory with its manifest only: remove both.
void remove_moved_inputs(const std::vector<Input>& inputs);

// The closing line (or --json document): `what` "merged 3 parts".
void report(const ConvertOptions& o, const std::string& what, std::uint64_t inputs, const Manifest& whole,
            const Placer& placer);

// ---- template definitions ----

template <typename Samples, typename Field>
void place_field(FieldInfo& field, std::size_t n, Samples samples_of, Field field_of, const std::vector<Input>& inputs,
                 Placer& placer) {
    std::vector<std::pair<std::size_t, FieldPart>> files; // (input, its file or part)
    for (std::size_t k = 0; k < n; ++k) {
        const FieldInfo* src = field_of(k);
        if (!src || samples_of(k) == 0) continue;
        if (src->parts.empty())
            files.push_back({k, FieldPart{src->file, samples_of(k), src->bytes, src->checksum}});
        else
            for (const FieldPart& p : src->parts) files.push_back({k, p});
    }
    for (std::size_t k = 0; k < n && files.empty(); ++k) // no input holds samples: the first one's (empty) file
        if (const FieldInfo* src = field_of(k))
            files.push_back(
                {k, src->parts.empty() ? FieldPart{src->file, 0, src->bytes, src->checksum} : src->parts.front()});
    field.bytes = 0;
    field.parts.clear();
    for (const auto& [k, part] : files) {
        const std::string name = files.size() == 1 ? part.file : part_file_name(part.file, k, n);
        placer.place(inputs[k].dir / part.file, name);
        field.parts.push_back({name, part.samples, part.bytes, part.checksum});
        field.bytes += part.bytes;
    }
    if (field.parts.size() == 1) {
        field.file = field.parts.front().file;
        field.checksum = field.parts.front().checksum;
        field.parts.clear();
    } else {
        field.file.clear();
        field.checksum.clear();
    }
}

} // namespace dstk::join
