#include "field_plan.hpp"

#include <algorithm>

#include "dstk/error.hpp"
#include "dstk/thread_pool.hpp"

namespace dstk::convert {

FieldInfo output_field(const std::string& split, const FieldPlan& p, std::uint64_t chunk_samples) {
    FieldInfo fi;
    fi.name = p.name;
    fi.dtype = p.out;
    fi.shape = p.shape;
    fi.storage = chunk_samples ? Storage::zstd_chunked : Storage::npy;
    fi.file = field_file_name(split, p.name, chunk_samples ? ".zst" : ".npy");
    fi.chunk_samples = chunk_samples;
    return fi;
}

void convert_block(std::vector<FieldPlan>& fields, const std::vector<std::vector<std::uint8_t>>& in,
                   std::vector<std::vector<std::uint8_t>>& out, std::uint64_t count, ThreadPool& pool) {
    for (std::size_t f = 0; f < fields.size(); ++f) {
        FieldPlan& p = fields[f];
        if (!p.convert) continue;
        const std::uint64_t n = count * p.shape.numel();
        out[f].resize(count * p.out_bytes);
        const std::uint64_t tasks = (n + convert_grain - 1) / convert_grain;
        std::vector<ConversionStats> part(tasks);
        const std::size_t ei = dtype_size(p.in), eo = dtype_size(p.out);
        pool.parallel_for(tasks, [&](std::uint64_t t) {
            const std::uint64_t a = t * convert_grain, b = std::min(n, a + convert_grain);
            convert_elements(p.in, p.out, in[f].data() + a * ei, out[f].data() + a * eo, b - a, p.map, part[t]);
        });
        for (const auto& s : part) p.stats.merge(s);
    }
}

void Router::route(const std::vector<const std::uint8_t*>& data, std::uint64_t count) {
    std::uint64_t done = 0;
    while (done < count) {
        while (cur_ < outs_.size() && outs_[cur_]->written == outs_[cur_]->samples) ++cur_;
        if (cur_ == outs_.size()) throw runtime_error("internal: more samples than the output splits hold");
        OutSplit& o = *outs_[cur_];
        const std::uint64_t take = std::min(count - done, o.samples - o.written);
        for (std::size_t f = 0; f < o.sinks.size(); ++f)
            o.sinks[f]->append(data[f] + done * fields_[f].out_bytes, take);
        o.written += take;
        done += take;
    }
}

} // namespace dstk::convert
