#include "dstk/dataset.hpp"

#include "dstk/error.hpp"

namespace fs = std::filesystem;

namespace dstk {

Dataset Dataset::open(const fs::path& dir) {
    Dataset d;
    d.dir_ = dir;
    d.manifest_ = load_manifest(dir);
    for (const auto& split : d.manifest_.splits)
        for (const auto& field : split.fields)
            d.readers_.emplace_back(split.name + "/" + field.name, open_field_reader(dir, split, field));
    return d;
}

const FieldReader& Dataset::reader(std::string_view split, std::string_view field) const {
    const SplitInfo& s = manifest_.split(split);
    (void)s.field(field); // names what exists when absent
    const std::string key = std::string(split) + "/" + std::string(field);
    for (const auto& [k, r] : readers_)
        if (k == key) return *r;
    throw runtime_error("no reader for " + key);
}

void Dataset::read(std::string_view split, std::string_view field, std::uint64_t first, std::uint64_t count,
                   void* dst) const {
    reader(split, field).read(first, count, dst);
}

void verify_dataset(const fs::path& dir) {
    const Dataset d = Dataset::open(dir);
    for (const auto& split : d.manifest().splits)
        for (const auto& field : split.fields) d.reader(split.name, field.name).verify();
}

} // namespace dstk
