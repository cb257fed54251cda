#include "source_fields.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "dstk/data/batch_source.hpp"
#include "dstk/error.hpp"
#include "dstk/units.hpp"

namespace dstk::data {
namespace {

std::string field_names(const SplitInfo& split) {
    std::string have;
    for (const FieldInfo& f : split.fields) have += (have.empty() ? "" : ", ") + f.name;
    return have;
}

std::vector<const FieldInfo*> named_fields(const SplitInfo& split, const std::vector<std::string>& names) {
    std::vector<const FieldInfo*> out;
    for (const std::string& name : names) {
        const FieldInfo* f = split.find(name);
        if (!f)
            throw usage_error("fields names '" + name + "', which split '" + split.name +
                              "' does not have (its fields: " + field_names(split) + "); name fields of the split");
        if (std::find(out.begin(), out.end(), f) != out.end())
            throw usage_error("fields names '" + name + "' twice (a batch holds each field once); name it once");
        out.push_back(f);
    }
    return out;
}

// A role of the manifest, which the default fields take.
const FieldInfo& role_field(const SplitInfo& split, const std::string& role, const std::string& name) {
    if (name.empty())
        throw usage_error("the manifest names no " + role + " field (" + role +
                          "_field is empty), and the default fields are its input and label fields; name the fields "
                          "to deliver in the setting fields (its fields: " +
                          field_names(split) + ")");
    if (const FieldInfo* f = split.find(name)) return *f;
    throw runtime_error("the manifest's " + role + "_field names field '" + name + "', which split '" + split.name +
                        "' does not have (its fields: " + field_names(split) +
                        "); name the fields to deliver in the setting fields, or re-create the dataset");
}

// The default fields: the trainer's pair, an input and one i32 class label per sample.
std::vector<const FieldInfo*> role_fields(const Manifest& m, const SplitInfo& split) {
    const FieldInfo& x = role_field(split, "input", m.input_field);
    const FieldInfo& y = role_field(split, "label", m.label_field);
    if (y.dtype != DType::i32 || y.shape.numel() != 1)
        throw runtime_error("labels '" + y.name + "' of split '" + split.name + "' are " +
                            std::string(dtype_name(y.dtype)) + " " + y.shape.str() +
                            " (the default fields' label is one i32 class per sample); name the fields to deliver in "
                            "the setting fields, or convert the labels with dsconvert");
    return {&x, &y};
}

} // namespace

std::vector<const FieldInfo*> source_fields(const Manifest& m, const SplitInfo& split, const SourceConfig& c) {
    return c.fields.empty() ? role_fields(m, split) : named_fields(split, c.fields);
}

SourceFields::SourceFields(const SplitInfo& split, std::vector<const FieldInfo*> fields)
    : split_(&split), list_(std::move(fields)) {
    if (list_.empty()) throw std::logic_error("SourceFields: no fields to deliver");
    for (std::size_t f = 1; f < list_.size(); ++f)
        if (list_[f]->sample_bytes() > list_[lead_]->sample_bytes()) lead_ = f;
}

bool SourceFields::bulk(std::size_t f) const {
    return 4 * list_[f]->sample_bytes() >= list_[lead_]->sample_bytes();
}

std::uint64_t SourceFields::row_bytes() const {
    std::uint64_t sum = 0;
    for (const FieldInfo* f : list_) sum = checked_add(sum, f->sample_bytes(), "bytes per sample");
    return sum;
}

OrderConfig SourceFields::order(const OrderConfig& config) const {
    OrderConfig o = config;
    const FieldInfo& lead = *list_[lead_];
    if (lead.storage == Storage::zstd_chunked) o.chunk_samples = lead.chunk_samples;
    return o;
}

std::uint64_t SourceFields::decoded_chunk() const {
    if (list_[lead_]->storage == Storage::zstd_chunked) return list_[lead_]->chunk_samples;
    for (const FieldInfo* f : list_)
        if (f->storage == Storage::zstd_chunked) return f->chunk_samples;
    return 0;
}

Batch SourceFields::batch() const {
    Batch b;
    for (const FieldInfo* f : list_) b.fields.push_back({f->name, f->dtype, f->shape, nullptr});
    return b;
}

} // namespace dstk::data
