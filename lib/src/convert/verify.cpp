// dsconvert --verify DIR: every file re-read, sizes and checksums checked.
#include <chrono>
#include <cstdio>

#include "convert_job.hpp"
#include "dstk/chunked_file.hpp"
#include "parts.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"

namespace dstk::convert {

void run_verify(const ConvertOptions& o) {
    const auto start = std::chrono::steady_clock::now();
    const Manifest m = load_manifest(o.input);
    std::vector<std::unique_ptr<PartedField>> fields; // all opened (and checked against the manifest) first
    for (const auto& split : m.splits)
        for (const auto& field : split.fields) fields.push_back(std::make_unique<PartedField>(o.input, split, field));
    ThreadPool pool(o.threads);
    std::uint64_t files = 0, bytes = 0;
    std::size_t next = 0;
    for (const auto& split : m.splits)
        for (const auto& field : split.fields) {
            throw_if_interrupted();
            fields[next++]->verify(&pool);
            files += std::max<std::size_t>(1, field.parts.size());
            bytes += field.bytes;
        }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (o.out.json) {
        nlohmann::json j = {
            {"dataset", o.input.string()}, {"ok", true}, {"files", files}, {"bytes", bytes}, {"seconds", secs}};
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("%s: OK (%llu files, %s verified in %s)\n", o.input.string().c_str(),
                    static_cast<unsigned long long>(files), format_bytes(bytes).c_str(), format_duration(secs).c_str());
    }
}

} // namespace dstk::convert
