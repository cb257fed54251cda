#include "dstk/model/onnx.hpp"

#include <cstring>
#include <string>
#include <string_view>

#include "dstk/model/saved_model.hpp"

namespace dstk::model {
namespace {

// Protobuf wire format: each field is a key (field number << 3 | wire type)
// followed by a varint (type 0), 4 bytes (type 5) or a length and bytes (type 2).
class Message {
  public:
    Message& varint(int field, std::uint64_t v) {
        key(field, 0);
        put_varint(v);
        return *this;
    }
    Message& fixed32(int field, float f) {
        key(field, 5);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>(u >> (8 * i)));
        return *this;
    }
    Message& bytes(int field, std::string_view b) {
        key(field, 2);
        put_varint(b.size());
        bytes_.append(b);
        return *this;
    }
    Message& message(int field, const Message& m) { return bytes(field, m.bytes_); }
    const std::string& str() const { return bytes_; }

  private:
    void key(int field, int type) { put_varint(static_cast<std::uint64_t>(field) << 3 | static_cast<unsigned>(type)); }
    void put_varint(std::uint64_t v) {
        while (v >= 0x80) {
            bytes_.push_back(static_cast<char>(v | 0x80));
            v >>= 7;
        }
        bytes_.push_back(static_cast<char>(v));
    }
    std::string bytes_;
};

// onnx.proto field numbers and enum values used here.
namespace f {
constexpr int model_ir_version = 1, model_producer_name = 2, model_producer_version = 3, model_graph = 7,
              model_opset_import = 8, model_metadata_props = 14;
constexpr int entry_key = 1, entry_value = 2;
constexpr int opset_version = 2;
constexpr int graph_node = 1, graph_name = 2, graph_initializer = 5, graph_input = 11, graph_output = 12;
constexpr int node_input = 1, node_output = 2, node_name = 3, node_op_type = 4, node_attribute = 5;
constexpr int attr_name = 1, attr_f = 2, attr_i = 3, attr_ints = 8, attr_type = 20;
constexpr int attr_float = 1, attr_int = 2, attr_ints_type = 7;
constexpr int tensor_dims = 1, tensor_data_type = 2, tensor_name = 8, tensor_raw_data = 9;
constexpr int elem_float = 1;
constexpr int value_name = 1, value_type = 2, type_tensor = 1, tensor_type_elem = 1, tensor_type_shape = 2;
constexpr int shape_dim = 1, dim_value = 1, dim_param = 2;
} // namespace f

Message attr_int(std::string_view name, std::int64_t v) {
    return Message()
        .bytes(f::attr_name, name)
        .varint(f::attr_i, static_cast<std::uint64_t>(v))
        .varint(f::attr_type, f::attr_int);
}
Message attr_float(std::string_view name, float v) {
    return Message().bytes(f::attr_name, name).fixed32(f::attr_f, v).varint(f::attr_type, f::attr_float);
}
Message attr_ints(std::string_view name, std::initializer_list<std::int64_t> vs) {
    Message m;
    m.bytes(f::attr_name, name);
    for (const auto v : vs) m.varint(f::attr_ints, static_cast<std::uint64_t>(v));
    return m.varint(f::attr_type, f::attr_ints_type);
}

class GraphBuilder {
  public:
    void initializer(const std::string& name, const std::vector<std::uint64_t>& dims, const float* data) {
        Message t;
        std::uint64_t n = 1;
        for (const auto d : dims) {
            t.varint(f::tensor_dims, d);
            n *= d;
        }
        t.varint(f::tensor_data_type, f::elem_float).bytes(f::tensor_name, name);
        t.bytes(f::tensor_raw_data, std::string_view(reinterpret_cast<const char*>(data), n * 4));
        graph_.message(f::graph_initializer, t);
    }
    // Adds a node reading `inputs`; returns the name of its output.
    std::string node(std::string_view op, std::initializer_list<std::string> inputs,
                     std::initializer_list<Message> attrs = {}) {
        const std::string out = std::string(op) + "_" + std::to_string(count_++);
        Message n;
        for (const auto& in : inputs) n.bytes(f::node_input, in);
        n.bytes(f::node_output, out).bytes(f::node_name, out).bytes(f::node_op_type, op);
        for (const auto& a : attrs) n.message(f::node_attribute, a);
        graph_.message(f::graph_node, n);
        return out;
    }
    Message& graph() { return graph_; }

  private:
    Message graph_;
    int count_ = 0;
};

Message value_info(std::string_view name, std::initializer_list<std::uint64_t> dims) {
    Message shape;
    shape.message(f::shape_dim, Message().bytes(f::dim_param, "N"));
    for (const auto d : dims) shape.message(f::shape_dim, Message().varint(f::dim_value, d));
    const Message tensor = Message().varint(f::tensor_type_elem, f::elem_float).message(f::tensor_type_shape, shape);
    return Message().bytes(f::value_name, name).message(f::value_type, Message().message(f::type_tensor, tensor));
}

// One node (or none) per layer; `x` is the running tensor name.
void add_layer(GraphBuilder& g, const SavedModel& m, const train::LayerPlan& l, const std::string& path, std::string& x,
               std::vector<std::string>& residual_inputs) {
    const float* p = m.params.data() + l.param_offset;
    const std::int64_t k = l.spec.kernel, s = l.spec.stride, pad = l.spec.padding;
    const std::uint64_t c = l.in.c, out = l.spec.out;
    switch (l.spec.kind) {
    case train::LayerKind::conv: {
        g.initializer(path + ".weight", {out, c, l.spec.kernel, l.spec.kernel}, p);
        if (l.spec.bias) g.initializer(path + ".bias", {out}, p + out * c * l.spec.kernel * l.spec.kernel);
        const Message attrs[] = {attr_ints("kernel_shape", {k, k}), attr_ints("strides", {s, s}),
                                 attr_ints("pads", {pad, pad, pad, pad})};
        x = l.spec.bias ? g.node("Conv", {x, path + ".weight", path + ".bias"}, {attrs[0], attrs[1], attrs[2]})
                        : g.node("Conv", {x, path + ".weight"}, {attrs[0], attrs[1], attrs[2]});
        break;
    }
    case train::LayerKind::batchnorm: {
        const float* st = m.states.data() + l.state_offset;
        g.initializer(path + ".weight", {c}, p);
        g.initializer(path + ".bias", {c}, p + c);
        g.initializer(path + ".running_mean", {c}, st);
        g.initializer(path + ".running_var", {c}, st + c);
        x = g.node("BatchNormalization",
                   {x, path + ".weight", path + ".bias", path + ".running_mean", path + ".running_var"},
                   {attr_float("epsilon", 1e-5f)});
        break;
    }
    case train::LayerKind::relu:
        x = g.node("Relu", {x});
        break;
    case train::LayerKind::tanh:
        x = g.node("Tanh", {x});
        break;
    case train::LayerKind::side: // the normalised side input after the flat features
        x = g.node("Concat", {g.node("Flatten", {x}, {attr_int("axis", 1)}), "side_normalized"}, {attr_int("axis", 1)});
        break;
    case train::LayerKind::head: // encode_onnx points x at the trunk's output
        break;
    case train::LayerKind::maxpool:
    case train::LayerKind::avgpool:
        x = g.node(l.spec.kind == train::LayerKind::maxpool ? "MaxPool" : "AveragePool", {x},
                   {attr_ints("kernel_shape", {k, k}), attr_ints("strides", {s, s})});
        break;
    case train::LayerKind::global_avgpool:
        x = g.node("GlobalAveragePool", {x});
        break;
    case train::LayerKind::flatten:
        x = g.node("Flatten", {x}, {attr_int("axis", 1)});
        break;
    case train::LayerKind::linear: {
        // dstk's fc also takes a C x 1 x 1 input (after gap): Flatten is the identity on a flat one.
        x = g.node("Flatten", {x}, {attr_int("axis", 1)});
        g.initializer(path + ".weight", {out, c}, p);
        if (l.spec.bias) {
            g.initializer(path + ".bias", {out}, p + out * c);
            x = g.node("Gemm", {x, path + ".weight", path + ".bias"}, {attr_int("transB", 1)});
        } else {
            x = g.node("Gemm", {x, path + ".weight"}, {attr_int("transB", 1)});
        }
        break;
    }
    case train::LayerKind::dropout:
        break;
    case train::LayerKind::residual_begin:
        residual_inputs.push_back(x);
        break;
    case train::LayerKind::residual_end:
        x = g.node("Add", {residual_inputs.back(), x});
        residual_inputs.pop_back();
        break;
    }
}

// The side input "side" [N, values], normalised with the model's mean and std
// (per channel of its shape, repeated over the channel's values).
void add_side_input(GraphBuilder& g, const SavedModel& m) {
    const std::uint64_t values = m.side_values, per = values / m.side.mean.size();
    std::vector<float> mean(values), stdev(values);
    for (std::uint64_t i = 0; i < values; ++i) {
        mean[i] = m.side.mean[i / per];
        stdev[i] = m.side.std[i / per];
    }
    g.initializer("side_mean", {1, values}, mean.data());
    g.initializer("side_std", {1, values}, stdev.data());
    const std::string centred = g.node("Sub", {"side", "side_mean"});
    Message div;
    div.bytes(f::node_input, centred).bytes(f::node_input, "side_std");
    div.bytes(f::node_output, "side_normalized").bytes(f::node_name, "side_normalized").bytes(f::node_op_type, "Div");
    g.graph().message(f::graph_node, div);
}

// A graph output, named, from the tensor x: flattened to [N, width].
void add_output(GraphBuilder& g, const std::string& x, const std::string& name, std::uint64_t width) {
    const std::string flat = g.node("Flatten", {x}, {attr_int("axis", 1)});
    Message out;
    out.bytes(f::node_input, flat).bytes(f::node_output, name).bytes(f::node_name, name);
    out.bytes(f::node_op_type, "Identity");
    g.graph().message(f::graph_node, out);
    g.graph().message(f::graph_output, value_info(name, {width}));
}

} // namespace

std::vector<std::uint8_t> encode_onnx(const SavedModel& m) {
    const train::NetworkPlan plan = m.plan();
    const auto paths = module_paths(plan);
    GraphBuilder g;
    g.graph().bytes(f::graph_name, "dstk_" + (m.spec.name.empty() ? std::string("model") : m.spec.name));
    const std::uint64_t c = plan.input.c;
    g.initializer("normalize_mean", {1, c, 1, 1}, m.mean.data());
    g.initializer("normalize_std", {1, c, 1, 1}, m.std.data());
    std::string x = g.node("Sub", {"input", "normalize_mean"});
    x = g.node("Div", {x, "normalize_std"});
    if (plan.side) add_side_input(g, m);
    std::vector<std::string> residual_inputs;
    std::string trunk;
    for (std::size_t i = 0; i < plan.layers.size(); ++i) {
        if (plan.layers[i].spec.kind == train::LayerKind::head) {
            if (trunk.empty()) trunk = x;
            x = trunk;
        }
        add_layer(g, m, plan.layers[i], paths[i], x, residual_inputs);
        for (const auto& h : plan.heads)
            if (h.output == i) add_output(g, x, h.name.empty() ? "logits" : h.name, h.target.width);
    }
    g.graph().message(f::graph_input, value_info("input", {plan.input.c, plan.input.h, plan.input.w}));
    if (plan.side) g.graph().message(f::graph_input, value_info("side", {plan.side}));

    Message model;
    model.varint(f::model_ir_version, 7)
        .bytes(f::model_producer_name, "dstk")
        .bytes(f::model_producer_version, m.dstk_version)
        .message(f::model_graph, g.graph())
        .message(f::model_opset_import, Message().varint(f::opset_version, 13));
    for (const auto& [key, value] : to_tensor_file(m).metadata)
        model.message(f::model_metadata_props, Message().bytes(f::entry_key, key).bytes(f::entry_value, value));
    const std::string& s = model.str();
    return {s.begin(), s.end()};
}

} // namespace dstk::model
