#include "dstk/train/model.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <cmath>
#include <sstream>

#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"

namespace dstk::train {
namespace {

// The kinds' names in messages and in dstrain's per-layer lines (the spec's
// own spelling is parse_layer's and layer_string's).
constexpr EnumNames<LayerKind, 14> layer_kind_names{{{{LayerKind::conv, "conv"},
                                                      {LayerKind::batchnorm, "batchnorm"},
                                                      {LayerKind::relu, "relu"},
                                                      {LayerKind::tanh, "tanh"},
                                                      {LayerKind::maxpool, "maxpool"},
                                                      {LayerKind::avgpool, "avgpool"},
                                                      {LayerKind::global_avgpool, "global-avgpool"},
                                                      {LayerKind::linear, "linear"},
                                                      {LayerKind::flatten, "flatten"},
                                                      {LayerKind::dropout, "dropout"},
                                                      {LayerKind::residual_begin, "residual"},
                                                      {LayerKind::residual_end, "residual-add"},
                                                      {LayerKind::side, "side-input"},
                                                      {LayerKind::head, "head"}}}};

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
    } else if (head == "tanh") {
        no_options();
        l.kind = LayerKind::tanh;
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
        throw usage_error("model spec: unknown layer '" + std::string(item) +
                          "' (expected convKxK:C, bn, relu, tanh, maxpoolK, avgpoolK, gap, flatten, fc:N, dropout:P, "
                          "res(...), side or "
                          "heads(...))");
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
    case LayerKind::tanh:
        return "tanh";
    case LayerKind::side:
        return "side";
    case LayerKind::head:
        return "head";
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

constexpr std::size_t max_heads = 16;

std::string char_at(std::size_t pos) {
    return "character " + std::to_string(pos + 1);
}

bool valid_name(std::string_view s) {
    if (s.empty() || s.size() > 64) return false;
    for (const char c : s)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    return true;
}

// Recursive descent over the grammar in model.hpp; every error names the
// character where it was found.
class SpecParser {
  public:
    explicit SpecParser(std::string_view text) : t_(text) {}

    ModelSpec parse() {
        m_.name = "custom";
        if (t_.size() > 65536)
            throw usage_error("model spec is " + std::to_string(t_.size()) + " characters (at most 65536)");
        if (t_.empty()) throw usage_error("model spec is empty (give a preset name or a layer list)");
        items(0, false);
        if (pos_ < t_.size()) throw usage_error("model spec: unmatched ')' at " + char_at(pos_));
        if (m_.layers.size() > 4096) throw usage_error("model spec has more than 4096 layers");
        return std::move(m_);
    }

  private:
    bool at(std::string_view s) const { return t_.substr(pos_, s.size()) == s; }

    // Items up to the end of the text, a ')' that closes a res( (depth > 0) or
    // the '>' that ends a head's layers (in_head, depth 0).
    void items(int depth, bool in_head) {
        for (;;) {
            if (pos_ >= t_.size()) throw usage_error("model spec ends with ',' or 'res(' (a layer is missing)");
            if (at("heads(")) {
                if (depth > 0 || in_head)
                    throw usage_error("model spec: heads(...) at " + char_at(pos_) +
                                      " inside a block (heads(...) is the last item of the spec)");
                heads();
                if (pos_ < t_.size())
                    throw usage_error("model spec: '" + std::string(t_.substr(pos_, 20)) + "' after heads(...) at " +
                                      char_at(pos_) + " (heads(...) is the last item of the spec)");
                return;
            }
            item(depth, in_head);
            if (pos_ == t_.size()) {
                if (in_head) throw usage_error("model spec: a head ends without '>FIELD' (e.g. value=fc:1>mse:y)");
                return;
            }
            const char c = t_[pos_];
            if (c == ',') {
                ++pos_;
                if (in_head) skip_spaces();
                continue;
            }
            if (c == ')' && depth > 0) return;
            if (c == '>' && in_head && depth == 0) return;
            if (c == ')' && in_head) throw usage_error("model spec: a head ends without '>FIELD' at " + char_at(pos_));
            if (c == ')') throw usage_error("model spec: unmatched ')' at " + char_at(pos_));
            throw usage_error("model spec: expected ',' at " + char_at(pos_));
        }
    }

    void item(int depth, bool in_head) {
        if (at("res(")) {
            if (depth >= 16) throw usage_error("model spec: residual blocks nested more than 16 deep");
            m_.layers.push_back({.kind = LayerKind::residual_begin});
            pos_ += 4;
            if (at(")")) throw usage_error("model spec: empty res() at " + char_at(pos_));
            items(depth + 1, in_head);
            if (pos_ >= t_.size()) throw usage_error("model spec: res( is not closed (missing ')')");
            m_.layers.push_back({.kind = LayerKind::residual_end});
            ++pos_;
            return;
        }
        std::size_t end = pos_;
        while (end < t_.size() && std::string_view(",()>").find(t_[end]) == std::string_view::npos) ++end;
        const auto tok = t_.substr(pos_, end - pos_);
        if (tok.empty()) throw usage_error("model spec: empty layer at " + char_at(pos_) + " (stray ',' or '('?)");
        if (end < t_.size() && t_[end] == '(')
            throw usage_error("model spec: unknown block '" + std::string(tok) +
                              "(' (only res(...) and heads(...) take a block)");
        if (tok == "side") {
            if (depth > 0 || in_head)
                throw usage_error("model spec: 'side' at " + char_at(pos_) +
                                  " inside a block (the side input joins the trunk at its top level)");
            for (const auto& l : m_.layers)
                if (l.kind == LayerKind::side) throw usage_error("model spec: 'side' given twice");
            m_.layers.push_back({.kind = LayerKind::side});
        } else {
            m_.layers.push_back(parse_layer(tok));
        }
        pos_ = end;
    }

    void skip_spaces() {
        while (pos_ < t_.size() && t_[pos_] == ' ') ++pos_;
    }

    // heads(NAME=items>TARGET, ...)
    void heads() {
        pos_ += 6;
        for (;;) {
            skip_spaces();
            const std::size_t eq = t_.find('=', pos_);
            const std::string name(t_.substr(pos_, eq == std::string_view::npos ? 0 : eq - pos_));
            if (eq == std::string_view::npos || !valid_name(name))
                throw usage_error("model spec: expected a head NAME= at " + char_at(pos_) +
                                  " (names: letters, digits, '_', '-', '.'), e.g. heads(value=fc:1>mse:y)");
            for (const auto& h : m_.heads)
                if (h.name == name) throw usage_error("model spec: two heads named '" + name + "'");
            if (m_.heads.size() == max_heads)
                throw usage_error("model spec: more than " + std::to_string(max_heads) + " heads");
            m_.layers.push_back({.kind = LayerKind::head});
            pos_ = eq + 1;
            if (!at(">")) items(0, true);
            ++pos_; // the '>'
            std::size_t end = pos_;
            while (end < t_.size() && t_[end] != ',' && t_[end] != ')') ++end;
            m_.heads.push_back(parse_target(name, t_.substr(pos_, end - pos_)));
            pos_ = end;
            if (pos_ >= t_.size()) throw usage_error("model spec: heads( is not closed (missing ')')");
            ++pos_;
            if (t_[pos_ - 1] == ')') return;
        }
    }

    // [LOSS:]FIELD[*WEIGHT]
    HeadSpec parse_target(const std::string& name, std::string_view text) const {
        HeadSpec h;
        h.name = name;
        const std::string what = "head '" + name + "' target '" + std::string(text) + "'";
        if (const auto star = text.find('*'); star != std::string_view::npos) {
            const std::string w(text.substr(star + 1));
            char* end = nullptr;
            const double v = std::strtod(w.c_str(), &end);
            if (w.empty() || end != w.c_str() + w.size() || !(v > 0 && v <= 1e6))
                throw usage_error("model spec: " + what + ": weight '" + w + "' (expected a number in (0, 1e6])");
            h.weight = static_cast<float>(v);
            text = text.substr(0, star);
        }
        if (const auto colon = text.find(':'); colon != std::string_view::npos) {
            h.loss = parse_loss(text.substr(0, colon), "model spec: " + what + ": loss");
            text = text.substr(colon + 1);
        }
        if (!valid_name(text))
            throw usage_error("model spec: " + what + " (expected [LOSS:]FIELD[*WEIGHT], e.g. mse:results*0.5)");
        h.target = std::string(text);
        return h;
    }

    std::string_view t_;
    std::size_t pos_ = 0;
    ModelSpec m_;
};

// The layers of one block as a spec list: residual blocks re-opened.
std::string layers_string(std::span<const LayerSpec> layers) {
    std::string s;
    bool need_comma = false;
    for (const auto& l : layers) {
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

std::string weight_string(float w) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, w);
    return std::string(buf, r.ptr);
}

} // namespace

std::string_view layer_kind_name(LayerKind k) {
    return layer_kind_names.name(k);
}

ModelSpec parse_model_spec(std::string_view text) {
    return SpecParser(text).parse();
}

std::string to_spec_string(const ModelSpec& m) {
    const auto first_head =
        std::find_if(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.kind == LayerKind::head; });
    std::string s = layers_string({m.layers.begin(), first_head});
    if (first_head == m.layers.end()) return s;
    s += s.empty() ? "heads(" : ",heads(";
    std::size_t h = 0;
    for (auto it = first_head; it != m.layers.end(); ++h) {
        const auto next =
            std::find_if(it + 1, m.layers.end(), [](const LayerSpec& l) { return l.kind == LayerKind::head; });
        const HeadSpec& hs = m.heads.at(h);
        if (h) s += ',';
        s += hs.name;
        s += '=';
        s += layers_string({it + 1, next});
        s += '>';
        if (hs.loss) (s += loss_name(*hs.loss)) += ':';
        s += hs.target;
        if (hs.weight != 1.0f) (s += '*') += weight_string(hs.weight);
        it = next;
    }
    return s + ")";
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

namespace {

bool is_integer(DType t) {
    return !is_float(t);
}

std::string field_text(const std::string& field, DType dtype, const Shape& shape) {
    return "'" + field + "' (" + std::string(dtype_name(dtype)) + (shape.dims.empty() ? "" : " " + shape.str()) + ")";
}

// Where the side input joins when the spec does not say: before heads(...),
// else before the last fc at the top level.
void place_side(ModelSpec& m) {
    auto& ls = m.layers;
    for (const auto& l : ls)
        if (l.kind == LayerKind::side) return;
    const auto head = std::find_if(ls.begin(), ls.end(), [](const LayerSpec& l) { return l.kind == LayerKind::head; });
    if (head != ls.end()) {
        ls.insert(head, LayerSpec{.kind = LayerKind::side});
        return;
    }
    int depth = 0;
    std::optional<std::size_t> last_fc;
    for (std::size_t i = 0; i < ls.size(); ++i) {
        depth += ls[i].kind == LayerKind::residual_begin ? 1 : ls[i].kind == LayerKind::residual_end ? -1 : 0;
        if (ls[i].kind == LayerKind::linear && depth == 0) last_fc = i;
    }
    if (!last_fc)
        throw usage_error("model: the side input joins before the last fc layer, and the spec has none at its top "
                          "level; place 'side' in the spec where it joins");
    ls.insert(ls.begin() + static_cast<std::ptrdiff_t>(*last_fc), LayerSpec{.kind = LayerKind::side});
}

struct Resolver {
    const ModelRequest& r;
    const FieldLookup& fields;

    FieldFacts lookup(const std::string& field, const std::string& role) const {
        const auto f = fields(field);
        if (!f)
            throw usage_error(role + " '" + field + "' is not a field of the data" +
                              (r.fields_known.empty() ? std::string() : " (fields: " + r.fields_known + ")"));
        if (field == r.input) throw usage_error(role + " '" + field + "' is the input field (choose another field)");
        return *f;
    }

    Target target(const std::string& field, std::optional<LossKind> loss, const std::string& role) const {
        const FieldFacts f = lookup(field, role);
        Target t{field, f.dtype, f.shape, loss.value_or(default_loss(f.dtype, f.shape)), 0};
        check_loss_fits(t.loss, field, f.dtype, f.shape, f.classes);
        if (t.loss != LossKind::ce) {
            if (f.shape.numel() > max_dim)
                throw usage_error(role + " " + field_text(field, f.dtype, f.shape) + " has more than " +
                                  std::to_string(max_dim) + " values per sample");
            t.width = static_cast<std::uint32_t>(f.shape.numel());
        } else {
            t.width = f.classes.value_or(0);
        }
        return t;
    }
};

bool is_preset(std::string_view name) {
    for (const auto& p : preset_names())
        if (name == p) return true;
    return name.substr(0, 4) == "mlp:";
}

} // namespace

LossKind default_loss(DType dtype, const Shape& shape) {
    return is_integer(dtype) && shape.numel() == 1 ? LossKind::ce : LossKind::mse;
}

void check_loss_fits(LossKind loss, const std::string& field, DType dtype, const Shape& shape,
                     std::optional<std::uint32_t> classes) {
    if (loss == LossKind::bce && classes && *classes > 2)
        throw usage_error("label " + field_text(field, dtype, shape) + " has " + std::to_string(*classes) +
                          " classes (0 to " + std::to_string(*classes - 1) +
                          ") but the loss bce learns targets of 0 or 1; choose ce for classes, or a field of 0/1 "
                          "values");
    if (loss != LossKind::ce || (is_integer(dtype) && shape.numel() == 1)) return;
    throw usage_error("label " + field_text(field, dtype, shape) +
                      " does not fit the loss ce (softmax cross-entropy learns one integer class per sample); choose "
                      "mse (regression), poisson or poisson-exp (counts) or bce (0/1 labels)");
}

ResolvedModel resolve_model(const ModelRequest& r, const FieldLookup& fields) {
    const Resolver res{r, fields};
    ResolvedModel out;
    if (is_preset(r.model)) {
        if (r.label.empty())
            throw usage_error("no target: the data has no label role; name the label field (fields: " + r.fields_known +
                              ")");
        const Target t = res.target(r.label, r.loss, "label");
        if (t.width == 0)
            throw usage_error("the preset " + r.model + " ends in fc:CLASSES, but the label '" + r.label +
                              "' has no class count in the dataset (dsconvert --num-classes sets it); or give a spec "
                              "ending in fc:K");
        out.spec = resolve_model(r.model, t.width);
    } else {
        out.spec = parse_model_spec(r.model);
    }
    if (out.spec.heads.empty()) {
        if (r.label.empty())
            throw usage_error("no target: the data has no label role and the model no heads(...); name the label "
                              "field (fields: " +
                              r.fields_known + ")");
        out.targets.push_back(res.target(r.label, r.loss, "label"));
    } else {
        if (r.loss)
            throw usage_error("a loss for the model, whose spec has heads(...): give each head its loss there "
                              "(NAME=LAYERS>LOSS:FIELD)");
        for (auto& h : out.spec.heads) {
            out.targets.push_back(res.target(h.target, h.loss, "head '" + h.name + "' target"));
            h.loss = out.targets.back().loss;
        }
    }
    if (!r.side.empty()) {
        const FieldFacts f = res.lookup(r.side, "side input");
        for (const auto& t : out.targets)
            if (t.field == r.side) throw usage_error("side input '" + r.side + "' is also a target");
        if (f.shape.numel() > max_dim)
            throw usage_error("side input " + field_text(r.side, f.dtype, f.shape) + " has more than " +
                              std::to_string(max_dim) + " values per sample");
        out.side = static_cast<std::uint32_t>(f.shape.numel());
        place_side(out.spec);
    }
    return out;
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

std::int32_t NetworkPlan::trunk_end() const {
    for (const auto& l : layers)
        if (l.spec.kind == LayerKind::head) return l.source;
    return -1;
}

std::uint64_t NetworkPlan::max_activation() const {
    std::uint64_t m = input.numel();
    for (const auto& l : layers) m = std::max(m, l.out.numel());
    return m;
}

namespace {

// Multiply-adds per sample of layer l's forward product (0 for layers without one).
std::uint64_t product_macs(const LayerPlan& l) {
    if (l.spec.kind == LayerKind::conv) return l.out.numel() * l.in.c * l.spec.kernel * l.spec.kernel;
    if (l.spec.kind == LayerKind::linear) return l.in.numel() * l.out.numel();
    return 0;
}

} // namespace

std::uint64_t NetworkPlan::forward_flops() const {
    std::uint64_t f = 0;
    for (const auto& l : layers) f += 2 * product_macs(l);
    return f;
}

std::uint64_t NetworkPlan::training_flops() const {
    // Whether each layer's output depends on parameters: only then does a
    // gradient flow into it, and a product reading it needs a data gradient.
    std::vector<bool> learned(layers.size(), false);
    const auto depends = [&](std::int32_t source) { return source >= 0 && learned[static_cast<std::size_t>(source)]; };
    std::uint64_t f = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
        const LayerPlan& l = layers[i];
        bool in = depends(l.source);
        if (l.spec.kind == LayerKind::residual_end && l.partner >= 0)
            in = in || depends(layers[static_cast<std::size_t>(l.partner)].source);
        learned[i] = in || l.param_count > 0;
        f += 2 * product_macs(l) * (in ? 3 : 2);
    }
    return f;
}

std::string NetworkPlan::summary() const {
    std::ostringstream o;
    o << "input " << input.str() << (side ? " + side input " + std::to_string(side) : std::string()) << "\n";
    for (std::size_t i = 0; i < layers.size(); ++i) {
        const auto& l = layers[i];
        o << "  " << i << " " << layer_string(l.spec) << " -> " << l.out.str();
        if (l.param_count) o << " (" << l.param_count << " params)";
        o << "\n";
    }
    for (const auto& h : heads)
        o << "head" << (h.name.empty() ? std::string() : " '" + h.name + "'") << ": layer " << h.output << ", "
          << h.target.width << " outputs, " << loss_name(h.target.loss) << " on '" << h.target.field << "'"
          << (h.weight != 1.0f ? " x " + weight_string(h.weight) : std::string()) << "\n";
    o << "parameters " << params << "\n";
    return o.str();
}

namespace {

// plan_network's walk over the layers: shapes, parameter slices, sources, heads.
class Planner {
  public:
    Planner(const ModelSpec& m, TensorShape input, const std::vector<Target>& targets, std::uint32_t side)
        : m_(m), targets_(targets) {
        if (input.numel() == 0) throw usage_error("input shape " + input.str() + " is empty");
        const std::size_t heads = std::max<std::size_t>(1, m.heads.size());
        if (targets.size() != heads)
            throw std::logic_error("plan_network: " + std::to_string(targets.size()) + " targets for " +
                                   std::to_string(heads) + " heads");
        p_.name = m.name;
        p_.input = input;
        p_.side = side;
        cur_ = input;
    }

    NetworkPlan run() {
        for (std::size_t i = 0; i < m_.layers.size(); ++i) layer(i);
        if (!open_.empty()) throw usage_error("model: res( is not closed");
        if (p_.layers.empty()) throw usage_error("model has no layers");
        bool has_side = false;
        for (const auto& l : p_.layers) has_side |= l.spec.kind == LayerKind::side;
        if (p_.side && !has_side) throw std::logic_error("plan_network: a side input without a side layer");
        end_head(static_cast<std::uint32_t>(p_.layers.size() - 1));
        return std::move(p_);
    }

  private:
    Error fail(std::size_t i, const std::string& why) const {
        return usage_error("model: layer " + std::to_string(i) + " '" + layer_string(m_.layers[i]) + "' on input " +
                           cur_.str() + " (" + why + ")");
    }

    // The head whose layers end at layer `last`: its output checked against its target.
    void end_head(std::uint32_t last) {
        const std::size_t h = p_.heads.size();
        HeadPlan hp;
        hp.target = targets_[h];
        if (!m_.heads.empty()) {
            hp.name = m_.heads[h].name;
            hp.weight = m_.heads[h].weight;
            hp.begin = head_begin_;
        }
        hp.output = last;
        const TensorShape out = p_.layers[last].out;
        const std::string who = hp.name.empty() ? std::string("the network") : "head '" + hp.name + "'";
        if (out.h * out.w != 1 && out.c != 1)
            throw usage_error("model: " + who + " ends with " + out.str() +
                              " values per sample (a prediction is flat: end it with flatten, gap or fc)");
        const std::uint64_t n = out.numel();
        Target& t = hp.target;
        if (t.loss == LossKind::ce && t.width == 0) {
            if (n < 2 || n > (1u << 24))
                throw usage_error("model: " + who + " ends with " + std::to_string(n) +
                                  " values, but softmax cross-entropy needs 2 or more classes (end with fc:K)");
            t.width = static_cast<std::uint32_t>(n);
        } else if (n != t.width) {
            const std::string what = t.loss == LossKind::ce ? std::to_string(t.width) + " classes"
                                                            : std::to_string(t.width) + " values per sample";
            throw usage_error("model: " + who + " ends with " + out.str() + " values per sample but its target '" +
                              t.field + "' has " + what + " (end with 'fc:" + std::to_string(t.width) + "')");
        }
        p_.heads.push_back(std::move(hp));
    }

    void layer(std::size_t i) {
        const LayerSpec& s = m_.layers[i];
        LayerPlan l;
        l.spec = s;
        l.source = static_cast<std::int32_t>(i) - 1;
        if (s.kind == LayerKind::head) {
            if (head_begin_ >= 0) end_head(static_cast<std::uint32_t>(i - 1));
            if (head_begin_ < 0) trunk_end_ = static_cast<std::int32_t>(i) - 1, trunk_out_ = cur_;
            head_begin_ = static_cast<std::int32_t>(i);
            l.source = trunk_end_;
            cur_ = trunk_out_;
        }
        l.in = cur_;
        l.out = shape_of(i, s, l);
        if (l.out.numel() == 0) throw fail(i, "empty output");
        if (l.out.numel() > (std::uint64_t{1} << 28)) throw fail(i, "output above 2^28 elements per sample");
        l.param_offset = p_.params;
        l.state_offset = p_.states;
        p_.params += l.param_count;
        p_.states += l.state_count;
        p_.layers.push_back(l);
        cur_ = l.out;
    }

    TensorShape shape_of(std::size_t i, const LayerSpec& s, LayerPlan& l) {
        const TensorShape cur = cur_;
        switch (s.kind) {
        case LayerKind::conv: {
            const std::uint64_t hp = std::uint64_t{cur.h} + 2 * s.padding, wp = std::uint64_t{cur.w} + 2 * s.padding;
            if (hp < s.kernel || wp < s.kernel) throw fail(i, "kernel larger than the padded image");
            l.param_count = std::uint64_t{s.out} * cur.c * s.kernel * s.kernel + (s.bias ? s.out : 0);
            return {s.out, static_cast<std::uint32_t>((hp - s.kernel) / s.stride + 1),
                    static_cast<std::uint32_t>((wp - s.kernel) / s.stride + 1)};
        }
        case LayerKind::batchnorm:
            l.param_count = 2 * std::uint64_t{cur.c};
            l.state_count = 2 * std::uint64_t{cur.c};
            return cur;
        case LayerKind::maxpool:
        case LayerKind::avgpool:
            if (cur.h < s.kernel || cur.w < s.kernel) throw fail(i, "pool window larger than the image");
            return {cur.c, (cur.h - s.kernel) / s.stride + 1, (cur.w - s.kernel) / s.stride + 1};
        case LayerKind::global_avgpool:
            return {cur.c, 1, 1};
        case LayerKind::flatten:
            if (cur.numel() > max_dim) throw fail(i, "more than " + std::to_string(max_dim) + " features");
            return {static_cast<std::uint32_t>(cur.numel()), 1, 1};
        case LayerKind::linear:
            if (cur.h != 1 || cur.w != 1) throw fail(i, "fc needs a flat input: add 'flatten' or 'gap' before it");
            l.param_count = std::uint64_t{s.out} * cur.c + (s.bias ? s.out : 0);
            return {s.out, 1, 1};
        case LayerKind::side:
            if (!p_.side)
                throw fail(i, "the spec joins a side input here, but no side input field is given (name one, or "
                              "drop 'side')");
            if (cur.h != 1 || cur.w != 1)
                throw fail(i, "the side input joins flat features: put 'side' after flatten, gap or fc");
            if (std::uint64_t{cur.c} + p_.side > max_dim)
                throw fail(i, "more than " + std::to_string(max_dim) + " features");
            return {cur.c + p_.side, 1, 1};
        case LayerKind::relu:
        case LayerKind::tanh:
        case LayerKind::dropout:
        case LayerKind::head:
            return cur;
        case LayerKind::residual_begin:
            open_.push_back(static_cast<std::int32_t>(i));
            return cur;
        case LayerKind::residual_end: {
            if (open_.empty()) throw fail(i, "')' without res(");
            const auto b = open_.back();
            open_.pop_back();
            if (p_.layers[b].in != cur)
                throw fail(i, "residual block changes the shape from " + p_.layers[b].in.str() + " to " + cur.str());
            l.partner = b;
            p_.layers[b].partner = static_cast<std::int32_t>(i);
            return cur;
        }
        }
        return cur;
    }

    const ModelSpec& m_;
    const std::vector<Target>& targets_;
    NetworkPlan p_;
    TensorShape cur_, trunk_out_;
    std::vector<std::int32_t> open_;
    std::int32_t head_begin_ = -1, trunk_end_ = -1;
};

} // namespace

NetworkPlan plan_network(const ModelSpec& m, TensorShape input, const std::vector<Target>& targets,
                         std::uint32_t side) {
    return Planner(m, input, targets, side).run();
}

NetworkPlan plan_network(const ModelSpec& m, TensorShape input, std::uint32_t classes) {
    if (classes < 2) throw usage_error("model: " + std::to_string(classes) + " classes (need at least 2)");
    if (!m.heads.empty()) throw usage_error("model spec has heads(...): plan it with their targets");
    return plan_network(m, input, {Target{"y", DType::i32, Shape{}, LossKind::ce, classes}});
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
