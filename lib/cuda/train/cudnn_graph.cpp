#include "cudnn_graph.hpp"

#include <algorithm>
#include <array>
#include <mutex>
#include <set>
#include <utility>

#include "cudnn_check.hpp"

namespace dstk::train::cuda {
namespace {

// A backend descriptor, destroyed with its owner. Descriptors that refer to
// others (a plan to its engine configuration, that to its graph) are kept
// alive together in GraphConv::Impl.
class Desc {
  public:
    explicit Desc(cudnnBackendDescriptorType_t t) { CUDNN_CHECK(cudnnBackendCreateDescriptor(t, &d_)); }
    Desc(const Desc&) = delete;
    Desc& operator=(const Desc&) = delete;
    ~Desc() { cudnnBackendDestroyDescriptor(d_); }
    cudnnBackendDescriptor_t get() const { return d_; }
    // get() by address, for attributes that take descriptors.
    const cudnnBackendDescriptor_t* ref() const { return &d_; }
    template <class T> void set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, const T* v, int n = 1) {
        CUDNN_CHECK(cudnnBackendSetAttribute(d_, a, t, n, v));
    }
    void link(cudnnBackendAttributeName_t a, const Desc& other) { set(a, CUDNN_TYPE_BACKEND_DESCRIPTOR, other.ref()); }
    bool finalize() { return cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS; }

  private:
    cudnnBackendDescriptor_t d_ = nullptr;
};
using DescPtr = std::shared_ptr<Desc>;

DescPtr make(cudnnBackendDescriptorType_t t) {
    return std::make_shared<Desc>(t);
}

// The three tensors' unique ids in a variant pack.
constexpr std::int64_t uid_x = 1, uid_w = 2, uid_y = 3;

DescPtr tensor(std::int64_t uid, cudnnDataType_t type, std::array<std::int64_t, 4> dims, bool nchw) {
    const auto [n, c, h, w] = dims;
    const std::array<std::int64_t, 4> strides = nchw ? std::array<std::int64_t, 4>{c * h * w, h * w, w, 1}
                                                     : std::array<std::int64_t, 4>{c * h * w, 1, w * c, c};
    const std::int64_t alignment = 16;
    auto d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type);
    d->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
    d->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
    d->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    d->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
    return d->finalize() ? d : nullptr;
}

DescPtr convolution(const GraphConvShape& s) {
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const std::int64_t dims = 2, one[2] = {1, 1}, pad[2] = {s.pad, s.pad}, stride[2] = {s.stride, s.stride};
    auto d = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    d->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
    d->set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode);
    d->set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &dims);
    d->set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, one, 2);
    d->set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride, 2);
    d->set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad, 2);
    d->set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad, 2);
    return d->finalize() ? d : nullptr;
}

// The attribute names of one operation kind: its descriptor type, then x, w,
// y (each as the operation names its tensor), the convolution, alpha, beta.
struct OpAttrs {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
OpAttrs op_attrs(ConvOp op) {
    switch (op) {
    case ConvOp::fwd:
        return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case ConvOp::bwd_data:
        return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvOp::bwd_filter:
        break;
    }
    return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

// The operation graph of one convolution, with what it refers to.
struct OpGraph {
    std::vector<DescPtr> parts;
    DescPtr graph;
};
OpGraph op_graph(cudnnHandle_t h, const GraphConvShape& s, ConvOp op, float beta) {
    OpGraph g;
    const auto x = tensor(uid_x, s.type, {s.n, s.c, s.h, s.w}, s.nchw);
    const auto w = tensor(uid_w, s.type, {s.k, s.c, s.kernel, s.kernel}, s.nchw);
    const auto y = tensor(uid_y, s.type, {s.n, s.k, s.oh, s.ow}, s.nchw);
    const auto conv = convolution(s);
    if (!x || !w || !y || !conv) return g;
    const OpAttrs a = op_attrs(op);
    const float alpha = 1.0f;
    auto o = make(a.type);
    o->link(a.x, *x);
    o->link(a.w, *w);
    o->link(a.y, *y);
    o->link(a.conv, *conv);
    o->set(a.alpha, CUDNN_TYPE_FLOAT, &alpha);
    o->set(a.beta, CUDNN_TYPE_FLOAT, &beta);
    if (!o->finalize()) return g;
    auto graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph->link(CUDNN_ATTR_OPERATIONGRAPH_OPS, *o);
    graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h);
    if (!graph->finalize()) return g;
    g.parts = {x, w, y, conv, o};
    g.graph = graph;
    return g;
}

template <class Note>
std::vector<Note> notes(const Desc& engine, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t) {
    std::vector<Note> v(16);
    std::int64_t got = 0;
    if (cudnnBackendGetAttribute(engine.get(), a, t, static_cast<std::int64_t>(v.size()), &got, v.data()) !=
        CUDNN_STATUS_SUCCESS)
        got = 0;
    v.resize(static_cast<std::size_t>(got));
    return v;
}

bool allowed(const Desc& engine, const GraphConvShape& s, const GraphConvRules& r) {
    for (const auto b :
         notes<cudnnBackendBehaviorNote_t>(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE))
        if (b == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return false;
    for (const auto n :
         notes<cudnnBackendNumericalNote_t>(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE)) {
        switch (n) {
        case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
            if (s.type == CUDNN_DATA_FLOAT && !r.allow_tensor_core) return false;
            break;
        case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
            if (r.deterministic) return false;
            break;
        case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP:
            break;
        default: // FFT, Winograd, reduced-precision reduction
            return false;
        }
    }
    return true;
}

// An engine configuration's engine and knob choices: what a name says and
// what a plan of the same kernel on another graph (beta 1) repeats.
struct Knobs {
    std::int64_t engine = -1;
    std::vector<std::pair<cudnnBackendKnobType_t, std::int64_t>> choices;
};
// The engine an engine configuration runs, read into `engine` (false where
// cuDNN does not say).
bool engine_of(const Desc& cfg, Desc& engine) {
    std::int64_t got = 0;
    auto e = engine.get();
    return cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                                    &e) == CUDNN_STATUS_SUCCESS;
}
// cfg's knobs; engine: its engine (engine_of).
Knobs knobs_of(const Desc& cfg, const Desc& engine) {
    Knobs k;
    std::int64_t got = 0;
    cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &k.engine);
    std::vector<std::unique_ptr<Desc>> choices;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
        choices.push_back(std::make_unique<Desc>(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
        raw.push_back(choices.back()->get());
    }
    if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 static_cast<std::int64_t>(raw.size()), &got, raw.data()) != CUDNN_STATUS_SUCCESS)
        got = 0;
    for (std::int64_t i = 0; i < got; ++i) {
        cudnnBackendKnobType_t t{};
        std::int64_t v = 0, one = 0;
        cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &one, &t);
        cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &one, &v);
        k.choices.emplace_back(t, v);
    }
    std::sort(k.choices.begin(), k.choices.end());
    return k;
}

std::string knob_name(const Knobs& k) {
    std::string s = "cudnn-graph:" + std::to_string(k.engine) + ":";
    for (std::size_t i = 0; i < k.choices.size(); ++i) {
        if (i) s += '.';
        s += std::to_string(static_cast<int>(k.choices[i].first));
        s += '=';
        s += std::to_string(k.choices[i].second);
    }
    return s;
}

// An engine configuration of `knobs` on graph g, built afresh.
DescPtr config_of(const OpGraph& g, const Knobs& knobs) {
    auto engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    engine->link(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, *g.graph);
    engine->set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &knobs.engine);
    if (!engine->finalize()) return nullptr;
    std::vector<DescPtr> choices;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (const auto& [type, value] : knobs.choices) {
        auto c = make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
        c->set(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, &type);
        c->set(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, &value);
        if (!c->finalize()) return nullptr;
        raw.push_back(c->get());
        choices.push_back(c);
    }
    auto cfg = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    cfg->link(CUDNN_ATTR_ENGINECFG_ENGINE, *engine);
    if (!raw.empty())
        cfg->set(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, raw.data(),
                 static_cast<int>(raw.size()));
    return cfg->finalize() ? cfg : nullptr;
}

// A plan of cfg, or null where cuDNN refuses it.
DescPtr plan_of(cudnnHandle_t h, const Desc& cfg) {
    auto plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h);
    plan->link(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    return plan->finalize() ? plan : nullptr;
}

std::int64_t workspace_of(const Desc& plan) {
    std::int64_t ws = 0, got = 0;
    CUDNN_CHECK(
        cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws));
    return ws;
}

// Engine configurations cuDNN's heuristic `mode` ranks for g, best first.
std::vector<DescPtr> ranked(const OpGraph& g, cudnnBackendHeurMode_t mode, int most) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.link(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *g.graph);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    if (!heur.finalize()) return {};
    std::vector<DescPtr> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < most; ++i) {
        cfgs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(cfgs.back()->get());
    }
    std::int64_t got = 0;
    if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, most, &got,
                                 raw.data()) != CUDNN_STATUS_SUCCESS)
        return {};
    cfgs.resize(static_cast<std::size_t>(got));
    return cfgs;
}

} // namespace

struct GraphConv::Impl {
    cudnnHandle_t handle = nullptr;
    GraphConvShape shape;
    ConvOp op = ConvOp::fwd;
    std::string name;
    Knobs knobs;
    OpGraph graph;
    DescPtr config, plan;
    std::uint64_t workspace = 0;
    // The beta-1 plan (GraphConv::run's accumulate), made once.
    mutable std::once_flag summed_once;
    mutable OpGraph summed_graph;
    mutable DescPtr summed_config, summed_plan;
};

GraphConv::GraphConv(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
GraphConv::~GraphConv() = default;
const std::string& GraphConv::name() const {
    return impl_->name;
}
std::uint64_t GraphConv::workspace() const {
    return impl_->workspace;
}

bool GraphConv::run(cudnnHandle_t h, void* x, void* w, void* y, void* workspace, bool accumulate) const {
    const Impl& m = *impl_;
    if (accumulate) {
        std::call_once(m.summed_once, [&] {
            m.summed_graph = op_graph(m.handle, m.shape, m.op, 1.0f);
            if (m.summed_graph.graph) m.summed_config = config_of(m.summed_graph, m.knobs);
            if (m.summed_config) m.summed_plan = plan_of(m.handle, *m.summed_config);
            if (m.summed_plan && static_cast<std::uint64_t>(workspace_of(*m.summed_plan)) > m.workspace)
                m.summed_plan.reset(); // the workspace was sized for the beta-0 plan
        });
        if (!m.summed_plan) return false;
    }
    const Desc& plan = accumulate ? *m.summed_plan : *m.plan;
    const std::int64_t uids[3] = {uid_x, uid_w, uid_y};
    void* ptrs[3] = {x, w, y};
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids, 3);
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs, 3);
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
    if (!pack.finalize()) return false;
    return cudnnBackendExecute(h, plan.get(), pack.get()) == CUDNN_STATUS_SUCCESS;
}

std::vector<std::shared_ptr<GraphConv>> graph_conv_candidates(cudnnHandle_t h, const GraphConvShape& s, ConvOp op,
                                                              const GraphConvRules& r) {
    std::vector<std::shared_ptr<GraphConv>> out;
    const OpGraph g = op_graph(h, s, op, 0.0f);
    if (!g.graph) return out;
    std::set<std::string> seen;
    for (const auto mode : {CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_A})
        for (const DescPtr& cfg : ranked(g, mode, r.per_heuristic)) {
            Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
            if (!engine_of(*cfg, engine) || !allowed(engine, s, r)) continue;
            const Knobs k = knobs_of(*cfg, engine);
            const std::string name = knob_name(k);
            if (k.engine < 0 || !seen.insert(name).second) continue;
            auto plan = plan_of(h, *cfg);
            if (!plan || static_cast<std::uint64_t>(workspace_of(*plan)) > r.workspace_limit) continue;
            auto impl = std::make_shared<GraphConv::Impl>();
            impl->handle = h;
            impl->shape = s;
            impl->op = op;
            impl->name = name;
            impl->knobs = k;
            impl->graph = g;
            impl->config = cfg;
            impl->plan = plan;
            impl->workspace = static_cast<std::uint64_t>(workspace_of(*plan));
            out.push_back(std::make_shared<GraphConv>(impl));
        }
    return out;
}

} // namespace dstk::train::cuda
