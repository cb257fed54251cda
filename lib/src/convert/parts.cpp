#include "parts.hpp"

#include <algorithm>

#include "dstk/error.hpp"

namespace dstk::convert {

std::vector<PartView> part_views(const SplitInfo& split, const FieldInfo& field) {
    if (field.parts.empty()) return {PartView{split, field}};
    std::vector<PartView> views;
    for (const FieldPart& p : field.parts) {
        PartView v{split, field};
        v.split.samples = p.samples;
        v.field.parts.clear();
        v.field.file = p.file;
        v.field.bytes = p.bytes;
        v.field.checksum = p.checksum;
        views.push_back(std::move(v));
    }
    return views;
}

bool has_parts(const Manifest& m) {
    for (const auto& s : m.splits)
        for (const auto& f : s.fields)
            if (!f.parts.empty()) return true;
    return false;
}

PartedField::PartedField(const std::filesystem::path& dir, const SplitInfo& split, const FieldInfo& field)
    : sample_bytes_(field.sample_bytes()) {
    std::uint64_t first = 0;
    for (const PartView& v : part_views(split, field)) {
        Part p;
        p.first = first;
        p.samples = v.split.samples;
        p.reader = open_field_reader(dir, v.split, v.field);
        if (v.field.storage == Storage::zstd_chunked) p.chunked = std::make_unique<ChunkedReader>(dir / v.field.file);
        first += p.samples;
        parts_.push_back(std::move(p));
    }
}

void PartedField::read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool) const {
    auto* out = static_cast<unsigned char*>(dst);
    for (const Part& p : parts_) {
        if (count == 0) return;
        if (first >= p.first + p.samples) continue;
        const std::uint64_t at = first - p.first, n = std::min(count, p.samples - at);
        if (p.chunked)
            p.chunked->read(at, n, out, pool);
        else
            p.reader->read(at, n, out);
        out += n * sample_bytes_;
        first += n;
        count -= n;
    }
    if (count) throw runtime_error("internal: read past the last part of a field");
}

void PartedField::verify(ThreadPool* pool) const {
    for (const Part& p : parts_) {
        if (p.chunked) p.chunked->verify(pool);
        p.reader->verify();
    }
}

} // namespace dstk::convert
