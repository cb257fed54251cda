// Named arrays (the members of an .npz, the files of a directory of .npy) as
// a source: one field per array, its name kept; a train/test affix of the
// name gives the split; the roles come from --input/--label, else from the
// usual names.
#include "formats.hpp"

#include <map>

namespace dstk::import {

namespace {

// "x_train" -> (train, x); "train_y" -> (train, y); anything else -> (train, name).
std::pair<std::string, std::string> split_and_field(std::string name) {
    if (ends_with(name, ".npy")) name.resize(name.size() - 4);
    static const char* splits[] = {"train", "test", "val", "valid", "validation"};
    for (const char* sp : splits) {
        const std::string s = sp;
        if (ends_with(name, "_" + s) && name.size() > s.size() + 1)
            return {split_for_prefix(s), name.substr(0, name.size() - s.size() - 1)};
        if (name.rfind(s + "_", 0) == 0 && name.size() > s.size() + 1)
            return {split_for_prefix(s), name.substr(s.size() + 1)};
    }
    return {"train", name};
}

std::string field_list(const SourceSplit& sp) {
    std::string out;
    for (const auto& f : sp.fields) {
        if (!out.empty()) out += ", ";
        out += f.name + ' ' + field_type_text(f.dtype, f.shape);
    }
    return out;
}

bool has_field(const SourceSplit& sp, const std::string& name) {
    for (const auto& f : sp.fields)
        if (f.name == name) return true;
    return false;
}

// The field that --input/--label NAME gives the role to: a field of that
// name, else the field of the array (member) of that name.
std::string role_field(const Source& s, const std::vector<NamedArray>& arrays, const std::string& name,
                       const char* flag, const std::string& where) {
    if (has_field(s.splits.front(), name)) return name;
    for (const auto& a : arrays)
        if (a.member == name) return split_and_field(name).second;
    std::string members;
    for (const auto& a : arrays) members += (members.empty() ? "" : ", ") + a.member;
    throw usage_error(std::string(flag) + " " + name + ": " + where + " has no such array (it has: " + members + ")");
}

// The roles not given, by the usual names: x/y, images/labels, data/target,
// X/Y, features/targets, inputs/targets; a lone array is the input (numpy's
// arr_0 becomes x).
void usual_roles(Source& s, std::size_t arrays) {
    SourceSplit& first = s.splits.front();
    static const char* inputs[] = {"x", "images", "data", "X", "features", "inputs"};
    static const char* labels[] = {"y", "labels", "target", "Y", "targets"};
    if (s.input_field.empty()) {
        if (arrays == 1 && s.label_field.empty() && first.fields.front().name == "arr_0")
            first.fields.front().name = "x";
        for (const char* n : inputs)
            if (s.input_field.empty() && has_field(first, n) && n != s.label_field) s.input_field = n;
        if (s.input_field.empty() && arrays == 1 && s.label_field.empty()) s.input_field = first.fields.front().name;
    }
    if (s.label_field.empty())
        for (const char* n : labels)
            if (s.label_field.empty() && has_field(first, n) && n != s.input_field) s.label_field = n;
}

void set_roles(Source& s, const std::vector<NamedArray>& arrays, const RawInputOptions& raw, const std::string& where) {
    s.input_field = raw.input.empty() ? "" : role_field(s, arrays, raw.input, "--input", where);
    s.label_field = raw.label.empty() ? "" : role_field(s, arrays, raw.label, "--label", where);
    if (!s.input_field.empty() && s.input_field == s.label_field)
        throw usage_error("--input and --label name the same field '" + s.input_field +
                          "'; a field has one role at most");
    s.roles_applied = true;
    usual_roles(s, arrays.size());
    if (s.input_field.empty() && s.label_field.empty())
        s.notices.push_back(
            where + ": no array is named as the input or the label (its fields: " + field_list(s.splits.front()) +
            "); the dataset records them without roles: give --input NAME and --label NAME to set "
            "them (dstrain and --dtype DTYPE need the input)");
}

} // namespace

Source source_from_arrays(std::vector<NamedArray> arrays, const RawInputOptions& raw, const std::string& where) {
    Source s;
    std::map<std::string, std::size_t> split_of; // split name -> index in s.splits
    for (NamedArray& a : arrays) {
        auto [split, field] = split_and_field(a.member);
        a.field.name = field;
        auto [it, fresh] = split_of.emplace(split, s.splits.size());
        if (fresh) {
            s.splits.push_back(SourceSplit{});
            s.splits.back().name = split;
            s.splits.back().samples = a.samples;
        }
        SourceSplit& sp = s.splits[it->second];
        if (sp.samples != a.samples)
            bad_input(where + ":" + a.member, "has " + std::to_string(a.samples) +
                                                  " samples but the other arrays of split '" + split + "' have " +
                                                  std::to_string(sp.samples) + " (the arrays of a split are one " +
                                                  "value per sample)");
        if (has_field(sp, field)) bad_input(where, "two arrays map to field '" + field + "' of split '" + split + "'");
        sp.fields.push_back(std::move(a.field));
    }
    if (s.splits.empty()) bad_input(where, "holds no .npy arrays");
    set_roles(s, arrays, raw, where);
    return s;
}

} // namespace dstk::import
