// dsconvert's field plan: what each field of the input becomes. The input
// field takes the bare --dtype and the mapping (--scale, --offset, --range);
// other fields take --dtype FIELD=DTYPE; integer class labels are stored as
// i32; the fields that can be an input get statistics.
#include "convert_job.hpp"

#include "dstk/error.hpp"

namespace dstk::convert {
namespace {

FieldPlan* find_plan(std::vector<FieldPlan>& fields, const std::string& name) {
    for (auto& p : fields)
        if (p.name == name) return &p;
    return nullptr;
}

[[noreturn]] void no_input_role(const Job& j, const std::string& what) {
    throw usage_error(what + ", and '" + j.o.input.string() +
                      "' names no input field (its fields: " + fields_text(j.fields) +
                      "); give --input NAME to set it, or convert a field by name with "
                      "--dtype FIELD=DTYPE");
}

// --dtype FIELD=DTYPE: floats stay floats (the mapping is the input's), class
// labels stay i32.
void apply_field_dtypes(Job& j) {
    for (const auto& [name, dtype] : j.o.field_dtypes) {
        FieldPlan* p = find_plan(j.fields, name);
        if (!p)
            throw usage_error("--dtype " + name + "=" + std::string(dtype_name(dtype)) + ": the input has no field '" +
                              name + "' (its fields: " + fields_text(j.fields) + ")");
        if (name == j.x_name) {
            if (j.o.dtype) throw usage_error("--dtype gives the input field '" + name + "' two dtypes; give one");
            continue; // the input's dtype, applied with the mapping
        }
        if (p->label)
            throw usage_error("--dtype " + name + "=" + std::string(dtype_name(dtype)) + ": '" + name +
                              "' is the class label, stored as i32 (the type dstrain reads); drop it");
        if (is_float(p->in) && !is_float(dtype))
            throw usage_error("--dtype " + name + "=" + std::string(dtype_name(dtype)) + ": converting float " +
                              std::string(dtype_name(p->in)) + " field '" + name +
                              "' to an integer type would clip and round it (the mapping --scale/--offset/--range "
                              "is the input field's); keep it a float type, e.g. " +
                              name + "=bf16");
        p->out = dtype;
    }
}

// The input field: its dtype (bare --dtype, or --dtype INPUT=DTYPE) and the mapping.
void plan_input(Job& j) {
    const ConvertOptions& o = j.o;
    std::optional<DType> dtype = o.dtype;
    for (const auto& [name, t] : o.field_dtypes)
        if (name == j.x_name) dtype = t;
    FieldPlan* xp = j.x();
    if (!xp) {
        if (o.dtype) no_input_role(j, "--dtype " + std::string(dtype_name(*o.dtype)) + " converts the input field");
        if (o.scale || o.offset || !o.range.empty())
            no_input_role(j, "--scale, --offset and --range map the input field");
        return;
    }
    if (dtype) xp->out = *dtype;
    xp->map.scale = o.scale.value_or(1.0);
    xp->map.offset = o.offset.value_or(0.0);
    if (is_float(xp->in) && !is_float(xp->out) && !o.scale && !o.offset && o.range.empty())
        throw usage_error("converting float " + std::string(dtype_name(xp->in)) + " to integer " +
                          std::string(dtype_name(xp->out)) +
                          " needs an explicit mapping (values would be clipped and rounded): give --range auto, "
                          "--range LO:HI, or --scale/--offset");
    if (j.settings.range_given)
        xp->map = range_mapping(j.settings.range_given->first, j.settings.range_given->second, xp->out);
}

} // namespace

std::string fields_text(const std::vector<FieldPlan>& fields) {
    std::string out;
    for (const auto& p : fields) {
        if (!out.empty()) out += ", ";
        out += p.name + ' ' + field_type_text(p.in, p.shape);
    }
    return out;
}

void plan_fields(Job& j) {
    const ConvertOptions& o = j.o;
    for (const auto& f : j.src.splits.front().fields) {
        FieldPlan p;
        p.name = f.name;
        p.in = p.out = f.dtype;
        p.shape = f.shape;
        j.fields.push_back(p);
    }
    for (const auto& sp : j.src.splits) {
        bool same = sp.fields.size() == j.fields.size();
        for (std::size_t i = 0; same && i < j.fields.size(); ++i)
            same = sp.fields[i].name == j.fields[i].name && sp.fields[i].dtype == j.fields[i].in &&
                   sp.fields[i].shape == j.fields[i].shape;
        if (!same)
            throw runtime_error(o.input.string() + ": split '" + sp.name + "' has different fields from split '" +
                                j.src.splits.front().name +
                                "' (a dataset's splits must share fields, dtypes and shapes)");
    }
    for (std::size_t i = 0; i < j.fields.size(); ++i) {
        FieldPlan& p = j.fields[i];
        if (p.name == j.x_name) j.x_index = i;
        // Labels of any integer type become i32, the type dstrain reads.
        if (p.name == j.y_name && !is_float(p.in) && p.shape.numel() == 1) {
            p.label = true;
            p.out = DType::i32;
        }
    }
    apply_field_dtypes(j);
    plan_input(j);
    // Statistics for every field that can be an input: the input's, and the
    // other float or unsigned fields but the label.
    for (FieldPlan& p : j.fields) {
        const bool input_like = is_float(p.out) || p.out == DType::u8 || p.out == DType::u16;
        p.channel_stats = p.name == j.x_name || (p.name != j.y_name && input_like);
    }
}

} // namespace dstk::convert
