#include "dstk/bench/case.hpp"

#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <stdexcept>

#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/npy.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"

namespace dstk::bench {

Settings default_settings() {
    Settings s;
    s.threads = {1, 4, hardware_threads()};
    std::sort(s.threads.begin(), s.threads.end());
    s.threads.erase(std::unique(s.threads.begin(), s.threads.end()), s.threads.end());
    s.transfer_sizes = {64ull << 10, 1ull << 20, 16ull << 20, 256ull << 20};
    return s;
}

void CaseRegistry::add(Case c) {
    for (const auto& existing : cases_)
        if (existing.key == c.key) throw std::logic_error("dsbench case registered twice: " + c.key);
    cases_.push_back(std::move(c));
}

std::vector<const Case*> CaseRegistry::select(std::string_view pattern) const {
    std::vector<const Case*> out;
    for (const auto& c : cases_)
        if (pattern.empty() ? c.in_default : key_matches(c.key, pattern)) out.push_back(&c);
    return out;
}

bool key_matches(std::string_view key, std::string_view pattern) {
    std::size_t start = 0;
    while (start <= pattern.size()) {
        std::size_t end = pattern.find(',', start);
        if (end == std::string_view::npos) end = pattern.size();
        const std::string p(pattern.substr(start, end - start));
        if (!p.empty()) {
            const std::string k(key);
            if (fnmatch(p.c_str(), k.c_str(), 0) == 0) return true;
            if (k.size() > p.size() && k.compare(0, p.size(), p) == 0 && k[p.size()] == '.') return true;
        }
        start = end + 1;
    }
    return false;
}

const CaseRegistry& builtin_cases() {
    static const CaseRegistry registry = [] {
        CaseRegistry r;
        add_io_cases(r);
        add_decode_cases(r);
        add_transfer_cases(r);
        add_loader_cases(r);
        return r;
    }();
    return registry;
}

std::optional<std::string> needs_target(const CaseContext& ctx) {
    if (!ctx.target) return "needs a dataset or file to read (give one: dsbench all DATA)";
    if (ctx.target->data_bytes == 0) return "the file holds no data";
    return std::nullopt;
}

std::string variant_threads(unsigned threads) {
    return "threads=" + std::to_string(threads);
}

std::string variant_size(std::uint64_t bytes) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) bytes /= 1024, ++u;
    return "size=" + std::to_string(bytes) + units[u];
}

namespace {

// The cases read the target at offsets: a FIFO or device would block them.
void require_target_file(const std::filesystem::path& file) {
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0) require_regular_file(st.st_mode, file, "benchmark target");
}

} // namespace

Target open_target(const std::filesystem::path& path, std::uint64_t sample_bytes) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (ec || !fs::exists(status))
        throw usage_error("cannot read '" + path.string() + "' (no such file or directory); give a dataset or a file");
    Target t;
    t.given = path;
    if (fs::is_directory(status)) {
        const Manifest m = load_manifest(path);
        if (m.splits.empty()) throw runtime_error(path.string() + ": dataset has no splits (nothing to read)");
        const SplitInfo& split = m.find("train") ? *m.find("train") : m.splits.front();
        const FieldInfo& field = split.field(m.input_field);
        t.dataset_dir = path;
        t.field = field;
        t.split = split.name;
        // A field in parts (dsconvert --merge): the file cases read its first
        // part, a file like the others on the same disk; loader cases read all.
        t.file = path / (field.parts.empty() ? field.file : field.parts.front().file);
        require_target_file(t.file);
        t.sample_bytes = field.sample_bytes();
        t.file_bytes = fs::file_size(t.file, ec);
        if (ec) throw_errno("cannot read the size of", t.file.string());
        if (field.storage == Storage::npy) {
            const NpyHeader h = read_npy_header(t.file);
            t.data_offset = h.data_offset;
            t.data_bytes = std::min(h.data_bytes(), t.file_bytes - std::min(t.file_bytes, h.data_offset));
        } else {
            // Compressed chunks: I/O cases read the bytes as stored.
            t.data_bytes = t.file_bytes;
        }
    } else {
        if (sample_bytes == 0) throw usage_error("invalid --sample-bytes=0 (must be positive)");
        require_target_file(path);
        t.file = path;
        t.sample_bytes = sample_bytes;
        t.file_bytes = fs::file_size(path, ec);
        if (ec) throw_errno("cannot read the size of", path.string());
        t.data_bytes = t.file_bytes;
    }
    return t;
}

} // namespace dstk::bench
