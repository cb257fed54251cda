// The machinery that --merge and --concat share (join.hpp).
#include "join.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/output.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk::join {

void check_options(const ConvertOptions& o, const std::vector<fs::path>& inputs, const char* mode) {
    const bool other = o.shard || o.dtype || o.scale || o.offset || !o.range.empty() || o.compress != "none" ||
                       o.chunk_samples || o.chunk_bytes || o.shuffle_seed || !o.split.empty() || !o.select.empty() ||
                       o.resume || o.to || o.verify_only || o.benchmark || o.from != InputFormat::automatic ||
                       o.raw.shape || o.raw.dtype || !o.raw.labels.empty() || !o.raw.input.empty() ||
                       !o.raw.label.empty() || !o.field_dtypes.empty() || o.num_classes || !o.report_json.empty();
    if (other)
        throw usage_error(std::string(mode) + " only joins " + (std::string(mode) == "--merge" ? "parts" : "datasets") +
                          " (their samples are not rewritten); drop the conversion options, and convert the "
                          "joined dataset afterwards if needed");
    for (const auto& p : inputs) {
        std::error_code ec;
        if (fs::exists(o.output, ec) && fs::equivalent(p, o.output, ec))
            throw usage_error(std::string(mode) + " OUTPUT '" + o.output.string() +
                              "' is one of its inputs; give a new directory");
    }
}

namespace {

void check_file(const fs::path& path, std::uint64_t bytes, const Input& in) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0)
        throw runtime_error("cannot read '" + path.string() + "' (" + std::strerror(errno) + "); re-create " +
                            in.name());
    if (!S_ISREG(st.st_mode))
        throw runtime_error("'" + path.string() + "' is not a regular file; re-create " + in.name());
    if (static_cast<std::uint64_t>(st.st_size) != bytes)
        throw runtime_error("'" + path.string() + "' has " + std::to_string(st.st_size) + " bytes but " + in.name() +
                            " says " + std::to_string(bytes) + " (file truncated or modified?); re-create " +
                            in.name());
}

} // namespace

void check_files(const std::vector<Input>& inputs) {
    for (const Input& in : inputs)
        for (const auto& s : in.m.splits)
            for (const auto& f : s.fields) {
                if (f.parts.empty()) check_file(in.dir / f.file, f.bytes, in);
                for (const FieldPart& p : f.parts) check_file(in.dir / p.file, p.bytes, in);
            }
}

std::string part_file_name(const std::string& file, std::uint64_t i, std::uint64_t n) {
    const fs::path f(file);
    char tag[64];
    std::snprintf(tag, sizeof tag, "-%05llu-of-%05llu", static_cast<unsigned long long>(i),
                  static_cast<unsigned long long>(n));
    return f.stem().string() + tag + f.extension().string();
}

Placer::~Placer() {
    if (done_) return;
    for (auto it = moved_.rbegin(); it != moved_.rend(); ++it)
        if (::rename(it->second.c_str(), it->first.c_str()) != 0)
            warning("could not move '" + it->second.string() + "' back to '" + it->first.string() +
                    "': " + std::strerror(errno) + "; move it back by hand");
}

void Placer::place(const fs::path& from, const std::string& name) {
    if (!move_) {
        const fs::path to = dir_.file(name); // a link: removing it on a signal loses nothing
        if (::link(from.c_str(), to.c_str()) == 0) {
            ++linked_files_;
            return;
        }
        const int err = errno;
        if (copy_ && err != EEXIST) return copy(from, to, err);
        if (err == EXDEV)
            throw runtime_error("cannot hard-link '" + from.string() + "' into '" + dir_.final_path().string() +
                                "' (they are on different filesystems, and --merge never copies samples); "
                                "give an OUTPUT on the parts' filesystem");
        throw runtime_error("cannot hard-link '" + from.string() + "' into '" + dir_.final_path().string() + "' (" +
                            std::strerror(err) +
                            "); give --move to rename the parts' files instead (on filesystems without hard links)");
    }
    const fs::path to = dir_.tmp_path() / name; // not registered: a signal must not delete moved samples
    if (::rename(from.c_str(), to.c_str()) != 0) {
        const int err = errno;
        throw runtime_error("cannot move '" + from.string() + "' into '" + dir_.final_path().string() + "' (" +
                            std::strerror(err) + ")" +
                            (err == EXDEV ? "; give an OUTPUT on the inputs' filesystem (--move never copies)" : ""));
    }
    moved_.emplace_back(from, to);
}

// A hard link was refused (another filesystem, or one without links): the
// bytes are copied, block by block, into a new file.
void Placer::copy(const fs::path& from, const fs::path& to, int link_errno) {
    if (copied_files_ == 0)
        note(out_, "cannot hard-link '" + from.string() + "' into '" + dir_.final_path().string() + "' (" +
                       std::strerror(link_errno) + "): copying the files that cannot be linked");
    const UniqueFd in = open_input_file(from, "dataset file");
    const UniqueFd out = UniqueFd::open(to, O_WRONLY | O_CREAT | O_EXCL, "cannot create");
    std::vector<std::uint8_t> buf(4u << 20);
    for (std::uint64_t at = 0;;) {
        throw_if_interrupted();
        const ssize_t n = ::pread(in.get(), buf.data(), buf.size(), static_cast<off_t>(at));
        if (n < 0) throw_errno("cannot read", from.string());
        if (n == 0) break;
        write_all(out.get(), buf.data(), static_cast<std::size_t>(n), static_cast<long long>(at), to);
        at += static_cast<std::uint64_t>(n);
        copied_bytes_ += static_cast<std::uint64_t>(n);
    }
    ++copied_files_;
}

void commit(AtomicDir& out, const Manifest& whole) {
    throw_if_interrupted();
    const std::string text = serialize_manifest(whole);
    (void)parse_manifest(text, "the joined manifest"); // its parts add up, checked before anything is renamed
    const fs::path path = out.file(manifest_file_name);
    const UniqueFd fd = UniqueFd::open(path, O_WRONLY | O_CREAT | O_TRUNC, "create");
    write_all(fd.get(), text.data(), text.size(), -1, path);
    out.commit();
}

void remove_moved_inputs(const std::vector<Input>& inputs) {
    for (const Input& in : inputs) {
        std::error_code ec;
        fs::remove(in.dir / manifest_file_name, ec);
        if (!fs::remove(in.dir, ec))
            warning("kept '" + in.dir.string() + "' (" + (ec ? ec.message() : "not empty") +
                    "): its dataset files are now in the joined dataset");
    }
}

void report(const ConvertOptions& o, const std::string& what, std::uint64_t inputs, const Manifest& whole,
            const Placer& placer) {
    std::uint64_t samples = 0, bytes = 0, files = 0;
    std::string splits;
    for (const auto& s : whole.splits) {
        samples += s.samples;
        splits += (splits.empty() ? "" : ", ") + s.name + " " + format_count(s.samples);
        for (const auto& f : s.fields) {
            bytes += f.bytes;
            files += std::max<std::size_t>(1, f.parts.size());
        }
    }
    const std::uint64_t copied = placer.copied_files(), linked = placer.linked_files();
    const char* method = o.move ? "move" : !copied ? "link" : !linked ? "copy" : "link+copy";
    if (o.out.json) {
        const nlohmann::json j = {{"tool", "dsconvert"},
                                  {what.substr(0, what.find(' ')), o.output.string()},
                                  {!o.merge_parts.empty() ? "parts" : "members", inputs},
                                  {"samples", samples},
                                  {"bytes", bytes},
                                  {"files", files},
                                  {"copied_files", copied},
                                  {"copied_bytes", placer.copied_bytes()},
                                  {"method", method}};
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    const std::string copy = "copied (" + format_bytes(placer.copied_bytes()) + ")";
    const std::string how = o.move    ? "moved, nothing copied"
                            : !copied ? "hard-linked, nothing copied"
                            : !linked ? copy
                                      : std::to_string(linked) + " hard-linked, " + std::to_string(copied) + " " + copy;
    note(o.out, "dsconvert: " + what + " (" + splits + " samples, " + format_bytes(bytes) + " in " +
                    std::to_string(files) + " files, " + how + ") -> " + o.output.string());
}

} // namespace dstk::join
