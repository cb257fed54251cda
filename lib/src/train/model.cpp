#include "dstk/train/model.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"

namespace dstk::train {
namespace {

// The kinds' names in messages and in dstrain's per-layer lines (the spec's
// own spelling is parse_layer's and layer_string's).
constexpr EnumNames<LayerKind, 11> layer_kind_names{{{{LayerKind::conv, "conv"},
                                                      {LayerKind::batchnorm, "batchnorm"},
                                                      {LayerKind::relu, "relu"},
                                                      {LayerKind::maxpool, "maxpool"},
                                                      {LayerKind::avgpool, "avgpool"},
                                                      {LayerKind::global_avgpool, "global-avgpool"},
                                                      {LayerKind::linear, "linear"},
                                                      {LayerKind::flatten, "flatten"},
                                                      {LayerKind::dropout, "dropout"},
                                                      {LayerKind::residual_begin, "residual"},
                                                      {LayerKind::residual_end, "residual-add"}}}};

constexpr std::uint32_t max_dim = 1u << 20;

bool starts_with(std::string_view s, std::string_view p) {
    return s.substr(0, p.size()) == p;
}

std::uint32_t parse_u32(std::string_view text, std::string_view item, std::string_view what) {
    std::uint32_t v = 0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v == 0 || v > max_dim)
        throw usage_error("model spec: invalid " + std::string(what) + " in '" + std::string(item) +
                          "' (expected an integer from 1 to " + std::to_string(max_dim) + ")");
    return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> out;
    std::size_t start = 0;
    for (std::size_t i = 0; i <= s.size(); ++i)
        if (i == s.size() || s[i] == sep) {
            out.push_back(s.substr(start, i - start));
            start = i + 1;
        }
    return out;
}

LayerSpec parse_layer(std::string_view item) {
    const auto parts = split(item, ':');
    const std::string_view head = parts[0];
    LayerSpec l;
    auto no_options = [&] {
        if (parts.size() != 1) throw usage_error("model spec: '" + std::string(item) + "' takes no options");
    };
    if (starts_with(head, "conv")) {
        l.kind = LayerKind::conv;
        const auto x = head.find('x');
        if (x == std::string_view::npos || parts.size() < 2)
            throw usage_error("model spec: invalid conv '" + std::string(item) +
                              "' (expected convKxK:C, e.g. conv3x3:32)");
        const auto k1 = parse_u32(head.substr(4, x - 4), item, "kernel size");
        const auto k2 = parse_u32(head.substr(x + 1), item, "kernel size");
        if (k1 != k2) throw usage_error("model spec: '" + std::string(item) + "' (only square kernels are supported)");
        l.kernel = k1;
        l.padding = k1 / 2;
        l.out = parse_u32(parts[1], item, "channel count");
        for (std::size_t i = 2; i < parts.size(); ++i) {
            if (parts[i] == "bias")
                l.bias = true;
            else if (starts_with(parts[i], "s"))
                l.stride = parse_u32(parts[i].substr(1), item, "stride");
            else if (parts[i] == "p0")
                l.padding = 0;
            else if (starts_with(parts[i], "p"))
                l.padding = parse_u32(parts[i].substr(1), item, "padding");
            else
                throw usage_error("model spec: unknown conv option '" + std::string(parts[i]) + "' in '" +
                                  std::string(item) + "' (expected sN, pN or bias)");
        }
        if (l.padding >= l.kernel)
            throw usage_error("model spec: padding " + std::to_string(l.padding) + " in '" + std::string(item) +
                              "' (must be smaller than the kernel)");
    } else if (head == "bn") {
        no_options();
        l.kind = LayerKind::batchnorm;
    } else if (head == "relu") {
        no_options();
        l.kind = LayerKind::relu;
    } else if (head == "flatten") {
        no_options();
        l.kind = LayerKind::flatten;
    } else if (head == "gap") {
        no_options();
        l.kind = LayerKind::global_avgpool;
    } else if (starts_with(head, "maxpool") || starts_with(head, "avgpool")) {
        l.kind = head[0] == 'm' ? LayerKind::maxpool : LayerKind::avgpool;
        l.kernel = parse_u32(head.substr(7), item, "pool size");
        l.stride = l.kernel;
        if (parts.size() > 2) throw usage_error("model spec: '" + std::string(item) + "' (expected poolK or poolK:sS)");
        if (parts.size() == 2) {
            if (!starts_with(parts[1], "s"))
                throw usage_error("model spec: unknown pool option '" + std::string(parts[1]) + "' (expected sN)");
            l.stride = parse_u32(parts[1].substr(1), item, "stride");
        }
    } else if (head == "fc") {
        l.kind = LayerKind::linear;
        l.bias = true;
        if (parts.size() < 2 || parts.size() > 3)
            throw usage_error("model spec: invalid '" + std::string(item) + "' (expected fc:N or fc:N:nobias)");
        l.out = parse_u32(parts[1], item, "feature count");
        if (parts.size() == 3) {
            if (parts[2] != "nobias")
                throw usage_error("model spec: unknown fc option '" + std::string(parts[2]) + "' (expected nobias)");
            l.bias = false;
        }
    } else if (head == "dropout") {
        l.kind = LayerKind::dropout;
        if (parts.size() != 2)
            throw usage_error("model spec: invalid '" + std::string(item) +
                              "' (expected dropout:P, e.g. dropout:0.25)");
        const std::string p(parts[1]);
        char* end = nullptr;
        const double v = std::strtod(p.c_str(), &end);
        // The check is on the stored float: 0.9999999999 rounds to 1.0f, which would divide by zero.
        const float f = static_cast<float>(v);
        if (p.empty() || end != p.c_str() + p.size() || !(f >= 0.0f && f < 1.0f))
            throw usage_error("model spec: dropout probability '" + p + "' (must be in [0, 1))");
        l.drop = f;
    } else {
        throw usage_error(
            "model spec: unknown layer '" + std::string(item) +
            "' (expected convKxK:C, bn, relu, maxpoolK, avgpoolK, gap, flatten, fc:N, dropout:P or res(...))");
    }
    return l;
}

std::string layer_string(const LayerSpec& l) {
    std::string s;
    switch (l.kind) {
    case LayerKind::conv:
        s = "conv" + std::to_string(l.kernel) + "x" + std::to_string(l.kernel) + ":" + std::to_string(l.out);
        if (l.stride != 1) s += ":s" + std::to_string(l.stride);
        if (l.padding != l.kernel / 2) s += ":p" + std::to_string(l.padding);
        if (l.bias) s += ":bias";
        return s;
    case LayerKind::batchnorm:
        return "bn";
    case LayerKind::relu:
        return "relu";
    case LayerKind::flatten:
        return "flatten";
    case LayerKind::global_avgpool:
        return "gap";
    case LayerKind::maxpool:
    case LayerKind::avgpool:
        s = (l.kind == LayerKind::maxpool ? "maxpool" : "avgpool") + std::to_string(l.kernel);
        if (l.stride != l.kernel) s += ":s" + std::to_string(l.stride);
        return s;
    case LayerKind::linear:
        return "fc:" + std::to_string(l.out) + (l.bias ? "" : ":nobias");
    case LayerKind::dropout: {
        // Shortest text that reads back as the same float, so a spec round-trips exactly.
        char buf[32];
        const auto r = std::to_chars(buf, buf + sizeof buf, l.drop);
        return "dropout:" + std::string(buf, r.ptr);
    }
    case LayerKind::residual_begin:
        return "res(";
    case LayerKind::residual_end:
        return ")";
    }
    return "?";
}

} // namespace

std::string_view layer_kind_name(LayerKind k) {
    return layer_kind_names.name(k);
}

ModelSpec parse_model_spec(std::string_view text) {
    ModelSpec m;
    m.name = "custom";
    if (text.size() > 65536)
        throw usage_error("model spec is " + std::to_string(text.size()) + " characters (at most 65536)");
    int depth = 0;
    std::size_t pos = 0;
    bool expect_item = true;
    while (pos < text.size()) {
        if (!expect_item) {
            if (text[pos] == ')') {
                if (depth == 0) throw usage_error("model spec: unmatched ')' at character " + std::to_string(pos + 1));
                if (m.layers.back().kind == LayerKind::residual_begin)
                    throw usage_error("model spec: empty res() at character " + std::to_string(pos + 1));
                m.layers.push_back({.kind = LayerKind::residual_end});
                --depth;
                ++pos;
                continue;
            }
            if (text[pos] != ',') throw usage_error("model spec: expected ',' at character " + std::to_string(pos + 1));
            ++pos;
            expect_item = true;
            continue;
        }
        if (text.substr(pos, 4) == "res(") {
            if (depth >= 16) throw usage_error("model spec: residual blocks nested more than 16 deep");
            m.layers.push_back({.kind = LayerKind::residual_begin});
            ++depth;
            pos += 4;
            continue;
        }
        std::size_t end = pos;
        while (end < text.size() && text[end] != ',' && text[end] != ')' && text[end] != '(') ++end;
        const auto item = text.substr(pos, end - pos);
        if (item.empty())
            throw usage_error("model spec: empty layer at character " + std::to_string(pos + 1) +
                              " (stray ',' or '('?)");
        if (end < text.size() && text[end] == '(')
            throw usage_error("model spec: unknown block '" + std::string(item) + "(' (only res(...) takes a block)");
        m.layers.push_back(parse_layer(item));
        pos = end;
        expect_item = false;
    }
    if (expect_item)
        throw usage_error(m.layers.empty() ? "model spec is empty (give a preset name or a layer list)"
                                           : "model spec ends with ',' or 'res(' (a layer is missing)");
    if (depth != 0) throw usage_error("model spec: res( is not closed (missing ')')");
    if (m.layers.size() > 4096) throw usage_error("model spec has more than 4096 layers");
    return m;
}

std::string to_spec_string(const ModelSpec& m) {
    std::string s;
    bool need_comma = false;
    for (const auto& l : m.layers) {
        if (l.kind == LayerKind::residual_end) {
            s += ')';
            need_comma = true;
            continue;
        }
        if (need_comma) s += ',';
        s += layer_string(l);
        need_comma = l.kind != LayerKind::residual_begin;
    }
    return s;
}

std::vector<std::string> preset_names() {
    return {"ref-cnn", "small-cnn", "resnet9", "mlp"};
}

ModelSpec resolve_model(std::string_view name, std::uint32_t classes) {
    const std::string c = std::to_string(classes);
    std::string spec;
    if (name == "ref-cnn") {
        spec = "conv3x3:32,bn,relu,conv3x3:32,bn,relu,maxpool2,conv3x3:64,bn,relu,conv3x3:64,bn,relu,maxpool2,"
               "conv3x3:128,bn,relu,maxpool2,flatten,fc:256,relu,fc:" +
               c;
    } else if (name == "small-cnn") {
        spec = "conv3x3:16,bn,relu,maxpool2,conv3x3:32,bn,relu,maxpool2,flatten,fc:" + c;
    } else if (name == "resnet9") {
        spec = "conv3x3:64,bn,relu,conv3x3:128,bn,relu,maxpool2,res(conv3x3:128,bn,relu,conv3x3:128,bn,relu),"
               "conv3x3:256,bn,relu,maxpool2,conv3x3:512,bn,relu,maxpool2,res(conv3x3:512,bn,relu,conv3x3:512,bn,relu),"
               "gap,flatten,fc:" +
               c;
    } else if (name == "mlp" || starts_with(name, "mlp:")) {
        const std::string_view widths = name == "mlp" ? std::string_view("1024,512") : name.substr(4);
        spec = "flatten";
        for (const auto w : split(widths, ','))
            spec += ",fc:" + std::to_string(parse_u32(w, name, "mlp width")) + ",relu";
        spec += ",fc:" + c;
    } else {
        return parse_model_spec(name);
    }
    ModelSpec m = parse_model_spec(spec);
    m.name = std::string(name);
    return m;
}

std::string TensorShape::str() const {
    return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
}

TensorShape tensor_shape_from(const Shape& s) {
    auto d32 = [&](std::uint64_t v) {
        if (v > max_dim)
            throw usage_error("input shape " + s.str() + " (dimensions above " + std::to_string(max_dim) +
                              " are not supported)");
        return static_cast<std::uint32_t>(v);
    };
    switch (s.dims.size()) {
    case 1:
        return {d32(s.dims[0]), 1, 1};
    case 2:
        return {1, d32(s.dims[0]), d32(s.dims[1])};
    case 3:
        return {d32(s.dims[0]), d32(s.dims[1]), d32(s.dims[2])};
    default:
        throw usage_error("input shape " + s.str() + " (dstrain needs 1 to 3 dimensions: D, HxW or CxHxW)");
    }
}

std::uint64_t NetworkPlan::max_activation() const {
    std::uint64_t m = input.numel();
    for (const auto& l : layers) m = std::max(m, l.out.numel());
    return m;
}

std::string NetworkPlan::summary() const {
    std::ostringstream o;
    o << "input " << input.str() << "\n";
    for (std::size_t i = 0; i < layers.size(); ++i) {
        const auto& l = layers[i];
        o << "  " << i << " " << layer_string(l.spec) << " -> " << l.out.str();
        if (l.param_count) o << " (" << l.param_count << " params)";
        o << "\n";
    }
    o << "parameters " << params << ", classes " << classes << "\n";
    return o.str();
}

NetworkPlan plan_network(const ModelSpec& m, TensorShape input, std::uint32_t classes) {
    if (input.numel() == 0) throw usage_error("input shape " + input.str() + " is empty");
    if (classes < 2) throw usage_error("model: " + std::to_string(classes) + " classes (need at least 2)");
    NetworkPlan p;
    p.name = m.name;
    p.input = input;
    p.classes = classes;
    TensorShape cur = input;
    std::vector<std::int32_t> open;
    auto fail = [&](std::size_t i, const std::string& why) {
        return usage_error("model: layer " + std::to_string(i) + " '" + layer_string(m.layers[i]) + "' on input " +
                           cur.str() + " (" + why + ")");
    };
    for (std::size_t i = 0; i < m.layers.size(); ++i) {
        const LayerSpec& s = m.layers[i];
        LayerPlan l;
        l.spec = s;
        l.in = cur;
        TensorShape out = cur;
        switch (s.kind) {
        case LayerKind::conv: {
            const std::uint64_t hp = std::uint64_t{cur.h} + 2 * s.padding, wp = std::uint64_t{cur.w} + 2 * s.padding;
            if (hp < s.kernel || wp < s.kernel) throw fail(i, "kernel larger than the padded image");
            out = {s.out, static_cast<std::uint32_t>((hp - s.kernel) / s.stride + 1),
                   static_cast<std::uint32_t>((wp - s.kernel) / s.stride + 1)};
            l.param_count = std::uint64_t{s.out} * cur.c * s.kernel * s.kernel + (s.bias ? s.out : 0);
            break;
        }
        case LayerKind::batchnorm:
            l.param_count = 2 * std::uint64_t{cur.c};
            l.state_count = 2 * std::uint64_t{cur.c};
            break;
        case LayerKind::maxpool:
        case LayerKind::avgpool:
            if (cur.h < s.kernel || cur.w < s.kernel) throw fail(i, "pool window larger than the image");
            out = {cur.c, (cur.h - s.kernel) / s.stride + 1, (cur.w - s.kernel) / s.stride + 1};
            break;
        case LayerKind::global_avgpool:
            out = {cur.c, 1, 1};
            break;
        case LayerKind::flatten:
            if (cur.numel() > max_dim) throw fail(i, "more than " + std::to_string(max_dim) + " features");
            out = {static_cast<std::uint32_t>(cur.numel()), 1, 1};
            break;
        case LayerKind::linear:
            if (cur.h != 1 || cur.w != 1) throw fail(i, "fc needs a flat input: add 'flatten' or 'gap' before it");
            out = {s.out, 1, 1};
            l.param_count = std::uint64_t{s.out} * cur.c + (s.bias ? s.out : 0);
            break;
        case LayerKind::relu:
        case LayerKind::dropout:
            break;
        case LayerKind::residual_begin:
            open.push_back(static_cast<std::int32_t>(i));
            break;
        case LayerKind::residual_end: {
            if (open.empty()) throw fail(i, "')' without res(");
            const auto b = open.back();
            open.pop_back();
            if (p.layers[b].in != cur)
                throw fail(i, "residual block changes the shape from " + p.layers[b].in.str() + " to " + cur.str());
            l.partner = b;
            p.layers[b].partner = static_cast<std::int32_t>(i);
            break;
        }
        }
        if (out.numel() == 0) throw fail(i, "empty output");
        if (out.numel() > (std::uint64_t{1} << 28)) throw fail(i, "output above 2^28 elements per sample");
        l.out = out;
        l.param_offset = p.params;
        l.state_offset = p.states;
        p.params += l.param_count;
        p.states += l.state_count;
        p.layers.push_back(l);
        cur = out;
    }
    if (!open.empty()) throw usage_error("model: res( is not closed");
    if (p.layers.empty()) throw usage_error("model has no layers");
    if (cur.numel() != classes)
        throw usage_error("model: the network ends with " + cur.str() + " values per sample but the dataset has " +
                          std::to_string(classes) + " classes (end with 'flatten,fc:" + std::to_string(classes) + "')");
    return p;
}

void init_parameters(const NetworkPlan& plan, std::uint64_t seed, std::span<float> params, std::span<float> states) {
    if (params.size() != plan.params || states.size() != plan.states)
        throw runtime_error("init_parameters: buffer sizes do not match the plan");
    for (std::size_t i = 0; i < plan.layers.size(); ++i) {
        const LayerPlan& l = plan.layers[i];
        float* p = params.data() + l.param_offset;
        CounterRng rng(seed, 0x7061726d0000ull + i); // per layer: adding a layer leaves the others' init alone
        switch (l.spec.kind) {
        case LayerKind::conv:
        case LayerKind::linear: {
            const std::uint64_t fan_in = l.spec.kind == LayerKind::conv
                                             ? std::uint64_t{l.in.c} * l.spec.kernel * l.spec.kernel
                                             : std::uint64_t{l.in.c};
            const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
            for (std::uint64_t j = 0; j < l.param_count; ++j) p[j] = static_cast<float>(rng.uniform(-bound, bound));
            break;
        }
        case LayerKind::batchnorm: {
            const std::uint32_t c = l.in.c;
            std::fill(p, p + c, 1.0f);
            std::fill(p + c, p + 2 * c, 0.0f);
            float* s = states.data() + l.state_offset;
            std::fill(s, s + c, 0.0f);
            std::fill(s + c, s + 2 * c, 1.0f);
            break;
        }
        default:
            break;
        }
    }
}

} // namespace dstk::train
