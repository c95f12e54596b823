#include "compiled_op.hpp"
#include "host_memory.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace onednn_convt {

namespace dg = dnnl::graph;
using lt = dg::logical_tensor;

// A number for the calling thread, never reused by a later thread (unlike its id).
uint64_t thread_token() {
    static std::atomic<uint64_t> next{1};
    thread_local const uint64_t token = next.fetch_add(1);
    return token;
}

std::shared_mutex &fork_gate() {
    static auto *gate = new std::shared_mutex;  // never destroyed: threads may exit after static teardown
    return *gate;
}

namespace {
thread_local int gate_depth = 0;  // nested ForkGates of this thread (only the outermost locks)
}  // namespace

namespace {
std::atomic<bool> entered{false};  // whether any thread has entered the library through a gate
}  // namespace

bool library_entered() { return entered.load(std::memory_order_relaxed); }

ForkGate::ForkGate() {
    if (gate_depth++ == 0) {
        fork_gate().lock_shared();
        entered.store(true, std::memory_order_relaxed);
    }
}

ForkGate::~ForkGate() {
    if (--gate_depth == 0) fork_gate().unlock_shared();
}

dnnl::engine &cpu_engine() {
    // the library's temporary memory comes from host_memory.hpp (large blocks kept between runs)
    static const dg::allocator allocator(host_allocate, host_deallocate);
    static dnnl::engine engine = dg::make_engine_with_allocator(dnnl::engine::kind::cpu, 0, allocator);
    return engine;
}

namespace {

[[noreturn]] void invalid(const std::string &kind, const std::string &what) {
    throw std::invalid_argument(kind + ": " + what);
}

lt::data_type to_data_type(const std::string &kind, const std::string &name) {
    if (name == "f32") return lt::data_type::f32;
    if (name == "bf16") return lt::data_type::bf16;
    if (name == "f16") return lt::data_type::f16;
    if (name == "s32") return lt::data_type::s32;
    if (name == "u8") return lt::data_type::u8;
    if (name == "s8") return lt::data_type::s8;
    invalid(kind, "unknown dtype code '" + name + "'");
}

dg::op::kind to_op_kind(const std::string &kind) {
    static const std::map<std::string, dg::op::kind> kinds = {
            {"ConvTranspose", dg::op::kind::ConvTranspose},
            {"ConvTransposeBackwardData", dg::op::kind::ConvTransposeBackwardData},
            {"ConvTransposeBackwardWeights", dg::op::kind::ConvTransposeBackwardWeights},
            {"Convolution", dg::op::kind::Convolution},
            {"ConvolutionBackwardData", dg::op::kind::ConvolutionBackwardData},
            {"ConvolutionBackwardWeights", dg::op::kind::ConvolutionBackwardWeights},
            {"MatMul", dg::op::kind::MatMul},
            // what a fused graph adds around a ConvTranspose (ops.py and post_ops.py say
            // which the library fuses): bias, (de)quantization, binary and unary post-ops
            {"BiasAdd", dg::op::kind::BiasAdd},
            {"Dequantize", dg::op::kind::Dequantize},
            {"Quantize", dg::op::kind::Quantize},
            {"TypeCast", dg::op::kind::TypeCast},
            {"Reorder", dg::op::kind::Reorder},
            {"Add", dg::op::kind::Add},
            {"Subtract", dg::op::kind::Subtract},
            {"Multiply", dg::op::kind::Multiply},
            {"Divide", dg::op::kind::Divide},
            {"Maximum", dg::op::kind::Maximum},
            {"Minimum", dg::op::kind::Minimum},
            {"Abs", dg::op::kind::Abs},
            {"Clamp", dg::op::kind::Clamp},
            {"Elu", dg::op::kind::Elu},
            {"Exp", dg::op::kind::Exp},
            {"GELU", dg::op::kind::GELU},
            {"HardSigmoid", dg::op::kind::HardSigmoid},
            {"HardSwish", dg::op::kind::HardSwish},
            {"LeakyReLU", dg::op::kind::LeakyReLU},
            {"Log", dg::op::kind::Log},
            {"Mish", dg::op::kind::Mish},
            {"Pow", dg::op::kind::Pow},
            {"ReLU", dg::op::kind::ReLU},
            {"Round", dg::op::kind::Round},
            {"Sigmoid", dg::op::kind::Sigmoid},
            {"SoftPlus", dg::op::kind::SoftPlus},
            {"Sqrt", dg::op::kind::Sqrt},
            {"Square", dg::op::kind::Square},
            {"Tanh", dg::op::kind::Tanh},
    };
    auto it = kinds.find(kind);
    if (it == kinds.end()) invalid(kind, "unsupported op kind");
    return it->second;
}

dg::op::attr to_attr(const std::string &kind, const std::string &name) {
    static const std::map<std::string, dg::op::attr> attrs = {
            {"strides", dg::op::attr::strides},
            {"pads_begin", dg::op::attr::pads_begin},
            {"pads_end", dg::op::attr::pads_end},
            {"dilations", dg::op::attr::dilations},
            {"auto_pad", dg::op::attr::auto_pad},
            {"groups", dg::op::attr::groups},
            {"data_format", dg::op::attr::data_format},
            {"weights_format", dg::op::attr::weights_format},
            {"output_padding", dg::op::attr::output_padding},
            {"weights_shape", dg::op::attr::weights_shape},
            {"dst_shape", dg::op::attr::dst_shape},
            {"alpha", dg::op::attr::alpha},
            {"beta", dg::op::attr::beta},
            {"min", dg::op::attr::min},
            {"max", dg::op::attr::max},
            {"scales", dg::op::attr::scales},
            {"zps", dg::op::attr::zps},
            {"axis", dg::op::attr::axis},
            {"qtype", dg::op::attr::qtype},
            {"auto_broadcast", dg::op::attr::auto_broadcast},
    };
    auto it = attrs.find(name);
    if (it == attrs.end()) invalid(kind, "unknown attribute '" + name + "'");
    return it->second;
}

const Dims *find_dims(const Attrs &attrs, const char *name) {
    auto it = attrs.find(name);
    return it == attrs.end() ? nullptr : std::get_if<Dims>(&it->second);
}

std::string find_string(const Attrs &attrs, const char *name, const char *fallback) {
    auto it = attrs.find(name);
    if (it == attrs.end()) return fallback;
    auto *s = std::get_if<std::string>(&it->second);
    return s ? *s : fallback;
}

// Sizes, pads, strides and dilations beyond this overflow oneDNN's shape arithmetic, which
// then accepts inconsistent problems (a pads_end of 2^62 passes its consistency check).
constexpr int64_t kMaxValue = (int64_t{1} << 31) - 1;

// MatMul [batch..., M, K] x [batch..., K, N] -> [batch..., M, N], the batch dims of equal
// rank and broadcast NumPy-style (each 1 or the output's; a 2-D operand is broadcast over
// the other's batch), plus an optional bias [N]; no attributes.
void check_matmul(const OpSpec &s) {
    const std::string &k = s.kind;
    if (s.inputs.size() < 2 || s.inputs.size() > 3 || !s.attrs.empty())
        invalid(k, "takes two inputs (and a bias) and no attributes");
    if (s.inputs.size() == 3 && (s.inputs[2].shape.size() != 1 || s.inputs[2].strides.size() != 1 ||
                                 s.output.shape.empty() || s.inputs[2].shape[0] != s.output.shape.back()))
        invalid(k, "bias must be 1-D with one value per output column");
    const Dims &a = s.inputs[0].shape, &b = s.inputs[1].shape, &c = s.output.shape;
    if (a.size() < 2 || b.size() < 2 || c.size() != std::max(a.size(), b.size()) ||
        (a.size() > 2 && b.size() > 2 && a.size() != b.size()))
        invalid(k, "unsupported ranks");
    for (const auto *t : {&s.inputs[0], &s.inputs[1], &s.output})
        if (t->shape.size() != t->strides.size()) invalid(k, "shape and strides differ in length");
    const size_t r = c.size();
    if (a.back() != b[b.size() - 2] || c[r - 2] != a[a.size() - 2] || c[r - 1] != b.back())
        invalid(k, "shapes do not multiply");
    for (const Dims *x : {&a, &b}) {
        if (x->size() == 2) continue;
        for (size_t i = 0; i + 2 < r; ++i)
            if ((*x)[i] != c[i] && (*x)[i] != 1) invalid(k, "batch dims do not broadcast to the output's");
    }
    for (size_t i = 0; i + 2 < r; ++i) {  // each output batch dim comes from an operand
        const bool from_a = a.size() > 2 && a[i] == c[i], from_b = b.size() > 2 && b[i] == c[i];
        if (!from_a && !from_b) invalid(k, "batch dims do not broadcast to the output's");
    }
}

void check_tensor(const std::string &kind, const TensorDesc &t, size_t max_rank = 6);

// Reorder: one input, copied into the output's strides (same shape and dtype), rank up to
// oneDNN's DNNL_MAX_NDIMS.
void check_reorder(const OpSpec &s) {
    if (s.inputs.size() != 1 || !s.attrs.empty()) invalid(s.kind, "takes one input and no attributes");
    check_tensor(s.kind, s.inputs[0], 12);
    check_tensor(s.kind, s.output, 12);
    if (s.inputs[0].shape != s.output.shape || s.inputs[0].dtype != s.output.dtype)
        invalid(s.kind, "input and output must have the same shape and dtype");
}

// The checks oneDNN 3.2 itself gets wrong by crashing (SIGFPE, abort, bad_alloc) rather
// than returning a status. The Python layer makes them first, with better messages; these
// keep a direct caller of _core from taking the process down.
void check_arguments(const OpSpec &s) {
    if (s.kind == "MatMul") return check_matmul(s);
    if (s.kind == "Reorder") return check_reorder(s);
    const std::string &k = s.kind;
    const auto rank = s.output.shape.size();
    if (rank < 3 || rank > 5) invalid(k, "tensors must have rank 3 to 5");
    const size_t spatial = rank - 2;
    for (size_t i = 0; i < s.inputs.size(); ++i) {
        const auto &t = s.inputs[i];
        if (t.shape.size() != t.strides.size()) invalid(k, "shape and strides differ in length");
        // inputs 0 and 1 are activations or weights; input 2 is a bias or weights_shape
        if (i < 2 && t.shape.size() != rank) invalid(k, "tensor ranks differ");
        for (auto d : t.shape)
            if (d < 1 || d > kMaxValue) invalid(k, "every dimension must be in [1, 2^31)");
    }
    for (auto d : s.output.shape)
        if (d < 1 || d > kMaxValue) invalid(k, "every dimension must be in [1, 2^31)");
    for (const char *name : {"weights_shape", "dst_shape"})
        if (const Dims *shape = find_dims(s.attrs, name))
            for (auto x : *shape)
                if (x < 0 || x > kMaxValue) invalid(k, std::string("attribute ") + name + " out of range");
    const char *lists[] = {"strides", "dilations", "pads_begin", "pads_end"};
    for (const char *name : lists) {
        const Dims *v = find_dims(s.attrs, name);
        if (!v) invalid(k, std::string("attribute ") + name + " is required");
        if (v->size() != spatial)
            invalid(k, std::string("attribute ") + name + " needs one entry per spatial dim");
        const int64_t low = (name[0] == 'p') ? 0 : 1;
        for (auto x : *v)
            if (x < low || x > kMaxValue) invalid(k, std::string("attribute ") + name + " out of range");
    }
    if (const Dims *op = find_dims(s.attrs, "output_padding")) {
        for (auto x : *op)
            if (x < 0 || x > kMaxValue) invalid(k, "attribute output_padding out of range");
    }
    int64_t groups = 1;
    if (auto it = s.attrs.find("groups"); it != s.attrs.end()) {
        auto *g = std::get_if<int64_t>(&it->second);
        if (!g || *g < 1) invalid(k, "attribute groups must be an integer >= 1");
        groups = *g;
    }
    // Channel consistency of (activation in 0, weights, output). Weights are input 1 for
    // every kind except the BackwardWeights ops, whose output is the weights.
    const bool bwd_w = k == "ConvTransposeBackwardWeights" || k == "ConvolutionBackwardWeights";
    if (s.inputs.size() < 2) invalid(k, "needs at least two inputs");
    const bool ncx = find_string(s.attrs, "data_format", "NXC") == "NCX";
    const std::string wf = find_string(s.attrs, "weights_format", "XOI");
    const bool channels_first_w = wf == "IOX" || wf == "OIX";
    auto chan = [&](const TensorDesc &t) { return ncx ? t.shape[1] : t.shape[rank - 1]; };
    const TensorDesc &w = bwd_w ? s.output : s.inputs[1];
    if (w.shape.size() != rank) invalid(k, "weights rank differs from the data rank");
    // IOX/OIX: dims 0,1; XOI/XIO: dims rank-1 (I or O last), rank-2.
    const int64_t w0 = channels_first_w ? w.shape[0] : w.shape[rank - 1];
    const int64_t w1 = channels_first_w ? w.shape[1] : w.shape[rank - 2];
    const TensorDesc &dst_like = bwd_w ? s.inputs[1] : s.output;
    const int64_t in_c = chan(s.inputs[0]), out_c = chan(dst_like);
    if (k.rfind("ConvTranspose", 0) == 0) {
        // IOX = [IC, OC/G, X], XOI = [X, OC/G, IC]: w0 is IC, w1 is OC/G.
        const int64_t ic = (k == "ConvTransposeBackwardData") ? out_c : in_c;
        const int64_t oc = (k == "ConvTransposeBackwardData") ? in_c : out_c;
        if (ic != w0 || ic % groups != 0 || oc != w1 * groups)
            invalid(k, "channel counts do not match weights and groups");
    } else {
        // Convolution weights OIX = [OC, IC/G, X], XIO = [X, IC/G, OC]: w0 is OC. Input 0 is
        // the convolution's src, except for ConvolutionBackwardData (its diff_dst).
        const bool from_dst = k == "ConvolutionBackwardData";
        const int64_t ic = from_dst ? out_c : in_c;
        const int64_t oc = from_dst ? in_c : out_c;
        if (oc != w0 || oc % groups != 0 || ic != w1 * groups)
            invalid(k, "channel counts do not match weights and groups");
    }
}

void set_attrs(dg::op &op, const std::string &kind, const Attrs &attrs) {
    for (const auto &[name, value] : attrs) {
        const auto a = to_attr(kind, name);
        if (auto *i = std::get_if<int64_t>(&value)) op.set_attr<int64_t>(a, *i);
        else if (auto *d = std::get_if<Dims>(&value)) op.set_attr<std::vector<int64_t>>(a, *d);
        else if (auto *x = std::get_if<double>(&value)) op.set_attr<float>(a, static_cast<float>(*x));
        else if (auto *f = std::get_if<Floats>(&value))
            op.set_attr<std::vector<float>>(a, std::vector<float>(f->begin(), f->end()));
        else op.set_attr<std::string>(a, std::get<std::string>(value));
    }
}

void check_tensor(const std::string &kind, const TensorDesc &t, size_t max_rank) {
    if (t.shape.empty() || t.shape.size() > max_rank || t.shape.size() != t.strides.size())
        invalid(kind, "tensors must have rank 1 to " + std::to_string(max_rank) + ", with one stride per dimension");
    for (auto d : t.shape)
        if (d < 1 || d > kMaxValue) invalid(kind, "every dimension must be in [1, 2^31)");
}

// The first node of the stage holding node n (OpSpec::stage_starts).
size_t stage_begin(const OpSpec &s, size_t n) {
    size_t begin = 0;
    for (size_t start : s.stage_starts)
        if (start <= n) begin = start;
    return begin;
}

// A graph's wiring (inputs in range, each node taking earlier nodes' outputs, every tensor
// used once it is made, stages that take only the previous stage's result), and each
// convolution-family node checked as a single op.
void check_graph(const OpSpec &s) {
    const std::string &k = s.kind;
    if (!s.attrs.empty()) invalid(k, "a graph's attributes belong to its nodes");
    for (size_t i = 0; i < s.stage_starts.size(); ++i)
        if (s.stage_starts[i] == 0 || s.stage_starts[i] >= s.nodes.size() ||
            (i > 0 && s.stage_starts[i] <= s.stage_starts[i - 1]))
            invalid(k, "stage starts must be ascending node indices after the first node");
    std::vector<bool> input_used(s.inputs.size(), false), output_used(s.nodes.size(), false);
    for (const auto &t : s.inputs) check_tensor(k, t);
    check_tensor(k, s.output);
    for (size_t n = 0; n < s.nodes.size(); ++n) {
        const NodeSpec &node = s.nodes[n];
        const bool last = n + 1 == s.nodes.size();
        OpSpec single{node.kind, node.attrs, {}, last ? s.output : node.output, {}, {}, {}};
        check_tensor(node.kind, single.output);
        if (node.inputs.empty()) invalid(node.kind, "a node needs an input");
        for (auto ref : node.inputs) {
            if (ref >= static_cast<int64_t>(s.inputs.size())) invalid(k, "node input index out of range");
            if (ref >= 0) {
                input_used[static_cast<size_t>(ref)] = true;
                single.inputs.push_back(s.inputs[static_cast<size_t>(ref)]);
                continue;
            }
            const int64_t from = -1 - ref;
            if (from >= static_cast<int64_t>(n)) invalid(k, "a node may take only earlier nodes' outputs");
            // across stages, only the previous stage's result (its last node's output) flows
            const size_t begin = stage_begin(s, n);
            if (static_cast<size_t>(from) < begin &&
                (begin == 0 || static_cast<size_t>(from) != begin - 1 || stage_begin(s, begin - 1) == begin))
                invalid(k, "a stage may take only the previous stage's result");
            output_used[static_cast<size_t>(from)] = true;
            single.inputs.push_back(s.nodes[static_cast<size_t>(from)].output);
        }
        to_op_kind(node.kind);  // a kind we know
        if (node.kind.rfind("Conv", 0) == 0 || node.kind == "MatMul") check_arguments(single);
    }
    for (bool used : input_used)
        if (!used) invalid(k, "every graph input must feed a node");
    for (size_t n = 0; n + 1 < s.nodes.size(); ++n)
        if (!output_used[n]) invalid(k, "every node but the last must feed a later node");
}

// Striped by spec key rather than one per CompiledOp: a lock that outlives any one compile
// of the spec, should the library ever share state between compiles of it (its own
// compiled-partition cache could, before module.cpp turned it off).
constexpr size_t kLockStripes = 64;
std::mutex execution_locks[kLockStripes];

// oneDNN 3.2 keeps each kernel's per-thread run state in a thread-local table
// (thread_local_cache_t<execution_args_set_t>). When a thread exits, that table's destructor
// takes a live entry outside the table's lock and then erases it under the lock; a kernel
// destroyed in between (its destructor drops its entries in every thread) leaves it erasing
// past the end of an empty vector: a segfault or heap corruption in whichever thread comes
// next (seen in CI; tests/test_threads.py reproduces it without this lock). So a kernel is
// never destroyed while a thread that ran kernels is exiting: ~CompiledOp frees the compiled
// partition holding teardown_mutex, and every thread holds it while its table is destroyed.
// Thread-local objects die in reverse order of construction: TeardownUnlock, made before a
// thread's first compile or run, dies after the library's table; TeardownLock, made after
// the thread's first run, dies before it.
std::mutex &teardown_mutex() {
    static auto *m = new std::mutex;  // never destroyed: threads may exit after static teardown
    return *m;
}

// Whether this thread holds teardown_mutex (it is exiting, between TeardownLock and
// TeardownUnlock): what it destroys then needs no lock (and must not wait for it).
thread_local bool holds_teardown = false;

struct TeardownUnlock {
    bool held = false;
    ~TeardownUnlock() {
        if (held) teardown_mutex().unlock();
        holds_teardown = false;
    }
};

struct ThreadLife;
ThreadLife &thread_life();

TeardownUnlock &teardown_unlock() {
    thread_life();  // made first, so destroyed last: after this thread gives the lock back
    thread_local TeardownUnlock unlock;
    return unlock;
}

struct TeardownLock {
    ~TeardownLock() {
        teardown_mutex().lock();
        holds_teardown = true;
        teardown_unlock().held = true;
    }
};

// Runs `destroy` (which destroys kernels) under teardown_mutex, unless this thread holds it.
template <typename F>
void with_teardown_lock(F &&destroy) {
    if (holds_teardown) return destroy();
    std::lock_guard<std::mutex> lock(teardown_mutex());
    destroy();
}

void arm_teardown_lock() {
    thread_local TeardownLock lock;
    (void)lock;
}


// OpSpec::bias_axis: an f32 output and a last input of one f32 value per entry of that dim.
void check_host_bias(const OpSpec &s) {
    const std::string &k = s.kind;
    const TensorDesc &b = s.inputs.empty() ? s.output : s.inputs.back();
    if (s.inputs.size() < 2 || b.shape.size() != 1 || b.strides.size() != 1)
        invalid(k, "a bias added after the library op must be a 1-D last input");
    if (s.bias_axis >= static_cast<int64_t>(s.output.shape.size()) ||
        b.shape[0] != s.output.shape[static_cast<size_t>(s.bias_axis)])
        invalid(k, "the bias must have one value per entry of the output's bias axis");
    if (b.dtype != "f32" || s.output.dtype != "f32") invalid(k, "a bias added after the library op must be f32");
    for (size_t c : s.constant_inputs)
        if (c + 1 == s.inputs.size()) invalid(k, "a bias added after the library op cannot be constant");
}

// out[..., i_axis, ...] += bias[i_axis] over an f32 tensor of any strides.
void add_bias(const TensorDesc &out, float *dst, const std::vector<float> &bias, size_t axis) {
    const size_t rank = out.shape.size(), last = rank - 1;
    const int64_t inner = out.shape[last], step = out.strides[last];
    std::vector<int64_t> index(rank, 0);
    int64_t base = 0;
    while (true) {
        float *row = dst + base;
        if (axis == last) {
            const float *b = bias.data();
            if (step == 1)  // dense rows (channels last): vectorized
                for (int64_t j = 0; j < inner; ++j) row[j] += b[j];
            else
                for (int64_t j = 0; j < inner; ++j) row[j * step] += b[j];
        } else {
            const float b = bias[static_cast<size_t>(index[axis])];
            if (step == 1)
                for (int64_t j = 0; j < inner; ++j) row[j] += b;
            else
                for (int64_t j = 0; j < inner; ++j) row[j * step] += b;
        }
        size_t d = last;  // the next row: an odometer over the dims before the last
        while (d-- > 0) {
            base += out.strides[d];
            if (++index[d] < out.shape[d]) break;
            base -= out.strides[d] * out.shape[d];
            index[d] = 0;
        }
        if (d == static_cast<size_t>(-1)) return;
    }
}

lt make_lt(const std::string &kind, size_t id, const TensorDesc &t, bool constant) {
    const auto property = constant ? lt::property_type::constant : lt::property_type::undef;
    return lt(id, to_data_type(kind, t.dtype), t.shape, t.strides, property);
}

// Logical tensor ids for ops with constant inputs, unique in the process: oneDNN's
// compiled-partition cache keys on them, so no later compile of the same shapes can be
// handed this op's kernel, whose constant cache holds this op's reordered values.
std::atomic<size_t> next_private_id{size_t{1} << 32};

}  // namespace

std::string OpSpec::key() const {
    std::ostringstream os;
    auto dims = [&os](const Dims &d) {
        for (auto x : d) os << x << ',';
        os << ';';
    };
    os.precision(17);  // f32 attributes exactly
    auto attributes = [&](const Attrs &a) {
        for (const auto &[name, value] : a) {
            os << name << '=';
            if (auto *i = std::get_if<int64_t>(&value)) os << *i << ';';
            else if (auto *d = std::get_if<Dims>(&value)) dims(*d);
            else if (auto *x = std::get_if<double>(&value)) os << 'f' << *x << ';';
            else if (auto *f = std::get_if<Floats>(&value)) {
                for (auto v : *f) os << v << ',';
                os << "f;";
            } else os << std::get<std::string>(value) << ';';
        }
    };
    auto tensor = [&](const TensorDesc &t) {
        os << t.dtype << ':';
        dims(t.shape);
        dims(t.strides);
    };
    os << kind << '|';
    attributes(attrs);
    for (size_t c : constant_inputs) os << "|const" << c;
    for (const auto &t : inputs) {
        os << '|';
        tensor(t);
    }
    os << "|>";
    tensor(output);
    for (size_t start : stage_starts) os << "|stage" << start;
    if (bias_axis >= 0) os << "|bias_axis" << bias_axis;
    for (const auto &n : nodes) {
        os << "|node " << n.kind << '(';
        for (auto i : n.inputs) os << i << ',';
        os << ')';
        attributes(n.attrs);
        os << '>';
        tensor(n.output);
    }
    return os.str();
}


namespace {

// A thread's copies of thread-bound ops (CompiledOp::thread_bound_), by the op's id, each
// with a weak view of the op's life: the thread alone owns them, so they are destroyed on it.
struct ThreadCopies {
    std::unordered_map<uint64_t, std::pair<std::weak_ptr<int>, std::shared_ptr<const CompiledOp>>> by_op;

    // Drops the copies whose op is gone (on this thread: see thread_bound_).
    void sweep() {
        for (auto it = by_op.begin(); it != by_op.end();)
            it = it->second.first.expired() ? by_op.erase(it) : std::next(it);
    }
};

// Stages of thread-bound ops dropped on another thread than their own, waiting for it.
struct Graveyard {
    std::mutex mutex;
    std::unordered_set<uint64_t> alive;  // threads that may still empty their graves
    std::unordered_map<uint64_t, std::vector<std::shared_ptr<void>>> graves;  // by owner thread
    std::atomic<size_t> pending{0};  // graves not yet emptied (checked without the lock)
    size_t orphans = 0;  // stages whose thread had exited: never destroyed (a leak, not a crash)
};

Graveyard &graveyard() {
    static auto *g = new Graveyard;  // never destroyed: threads may exit after static teardown
    return *g;
}

// Destroys what other threads left for this thread to destroy.
void empty_my_graves(uint64_t token) {
    if (graveyard().pending.load(std::memory_order_relaxed) == 0) return;
    std::vector<std::shared_ptr<void>> mine;
    {
        std::lock_guard<std::mutex> lock(graveyard().mutex);
        auto it = graveyard().graves.find(token);
        if (it == graveyard().graves.end()) return;
        mine.swap(it->second);
        graveyard().graves.erase(it);
        graveyard().pending -= mine.size();
    }
    with_teardown_lock([&] { mine.clear(); });  // here, outside the graveyard's lock
}

// A thread's registration with the graveyard, and its copies; at the thread's exit both are
// emptied on the thread itself.
struct ThreadLife {
    uint64_t token;
    ThreadCopies copies;
    explicit ThreadLife(uint64_t t) : token(t) {
        std::lock_guard<std::mutex> lock(graveyard().mutex);
        graveyard().alive.insert(token);
    }
    ~ThreadLife() {
        {
            std::lock_guard<std::mutex> lock(graveyard().mutex);
            graveyard().alive.erase(token);
        }
        copies.by_op.clear();
        empty_my_graves(token);
    }
};

ThreadLife &thread_life() {
    thread_local ThreadLife life(thread_token());
    return life;
}

std::atomic<uint64_t> next_op_id{1};

// A fork while another thread holds a lock would leave it locked forever in the child,
// where that thread does not exist. The library's own locks (its primitive cache's, taken
// while it builds kernels) cannot be reset, so a fork waits at the gate until no thread
// is inside the library through this binding (ForkGate: compiles, runs, kernel
// destruction, the partition cache); and the child starts with fresh locks of ours. (The
// child of a fork taken while another thread compiled hung: fuzz/fork.py.)
void before_fork() {
    fork_gate().lock();
    host_memory_before_fork();  // a leaf lock: no thread holding it waits at the gate
}
void after_fork_in_parent() {
    host_memory_after_fork_in_parent();
    fork_gate().unlock();
}
void after_fork_in_child() {
    new (&fork_gate()) std::shared_mutex;
    for (auto &m : execution_locks) new (&m) std::mutex;
    new (&teardown_mutex()) std::mutex;
    new (&graveyard().mutex) std::mutex;
    host_memory_after_fork_in_child();
}
[[maybe_unused]] const int atfork_registered = pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);

}  // namespace

// The calling thread's OpenMP thread count (GNU OpenMP, loaded with oneDNN), which a kernel
// splits its work by when it is compiled; 0 where OpenMP is not found.
using OmpGet = int (*)();
using OmpSet = void (*)(int);
static int omp_threads() {
    static auto get = reinterpret_cast<OmpGet>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    return get ? get() : 0;
}
static void set_omp_threads(int n) {
    static auto set = reinterpret_cast<OmpSet>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (set && n > 0) set(n);
}

CompiledOp::CompiledOp(OpSpec spec, bool private_ids) : spec_(std::move(spec)) {
    ForkGate gate;
    teardown_unlock();  // before anything of the library's in this thread (see teardown_mutex)
    const std::string &k = spec_.kind;
    // the bias the host adds (OpSpec::bias_axis) is no input of the library's graph
    OpSpec library = spec_;
    if (spec_.bias_axis >= 0) {
        check_host_bias(spec_);
        library.inputs.pop_back();
    }
    if (spec_.nodes.empty()) check_arguments(library);
    else check_graph(library);
    for (size_t c : spec_.constant_inputs)
        if (c >= spec_.inputs.size()) invalid(k, "constant input index out of range");
    const size_t count = spec_.inputs.size() + std::max<size_t>(1, spec_.nodes.size());
    size_t id = spec_.constant_inputs.empty() && !private_ids ? 0 : next_private_id.fetch_add(count);
    std::vector<lt> inputs;
    for (size_t i = 0; i < library.inputs.size(); ++i) {
        const auto &c = spec_.constant_inputs;
        const bool constant = std::find(c.begin(), c.end(), i) != c.end();
        inputs.push_back(make_lt(k, id++, spec_.inputs[i], constant));
    }
    if (!spec_.stage_starts.empty() && spec_.nodes.empty()) invalid(k, "stages need a graph");
    std::vector<lt> outputs;  // node n writes outputs[n]; the last one is the graph's output
    if (spec_.nodes.empty()) {
        outputs.push_back(make_lt(k, id, spec_.output, false));
    } else {
        for (size_t n = 0; n < spec_.nodes.size(); ++n) {
            const bool last = n + 1 == spec_.nodes.size();
            outputs.push_back(make_lt(spec_.nodes[n].kind, id++, last ? spec_.output : spec_.nodes[n].output, false));
        }
    }
    std::vector<size_t> bounds{0};
    bounds.insert(bounds.end(), spec_.stage_starts.begin(), spec_.stage_starts.end());
    bounds.push_back(std::max<size_t>(1, spec_.nodes.size()));
    for (size_t b = 0; b + 1 < bounds.size(); ++b) build_stage(bounds[b], bounds[b + 1], inputs, outputs);
    // which partitions write into the output's memory (see Stage::to_output), last first
    const TensorDesc &o = spec_.output;
    stages_.back().to_output = true;
    for (size_t s = stages_.size() - 1; s-- > 0;) {
        const TensorDesc &d = stages_[s].output;
        std::vector<size_t> users;
        for (size_t later = s + 1; later < stages_.size(); ++later)
            for (int64_t src : stages_[later].sources)
                if (src == -1 - static_cast<int64_t>(s)) users.push_back(later);
        stages_[s].to_output = users.size() == 1 && stages_[users[0]].to_output &&
                               stages_[users[0]].in_place_source == static_cast<int64_t>(s) && d.shape == o.shape &&
                               d.strides == o.strides && d.dtype == o.dtype;
    }
    std::vector<bool> taken(inputs.size(), false);  // the library's inputs: no host bias
    for (const Stage &stage : stages_)
        for (int64_t src : stage.sources)
            if (src >= 0) taken[static_cast<size_t>(src)] = true;
    if (std::find(taken.begin(), taken.end(), false) != taken.end())
        invalid(k, "the partitions do not take every graph input");
    // graph inputs the library may read from the output's memory: the last stage's in-place
    // ports (an earlier stage then writes elsewhere: stage_target sees the overlap)
    const Stage &last = stages_.back();
    for (const auto &pair : last.compiled.get_inplace_ports()) {
        if (pair.second != last.output_lt.get_id()) continue;
        for (size_t i = 0; i < inputs.size(); ++i)
            if (inputs[i].get_id() == pair.first) inplace_inputs_.push_back(i);
    }
    // ConvolutionBackwardWeights shares it too (measured: 20 of 100 concurrent calls wrong),
    // and so does ConvolutionBackwardData (4 threads on one partition: wrong values in 25-30
    // of 30 rounds; one partition per thread: none)
    auto shared_scratchpad = [](const std::string &kind) {
        return kind == "ConvTransposeBackwardWeights" || kind == "ConvolutionBackwardWeights" ||
               kind == "ConvolutionBackwardData";
    };
    serialized_ = shared_scratchpad(k);
    for (const auto &node : spec_.nodes) serialized_ = serialized_ || shared_scratchpad(node.kind);
    // the kinds whose primitives the library creates in its own scratchpad mode (its verbose
    // log lacks attr-scratchpad:user), where a GEMM kernel takes the global scratchpad: gemm:jit
    // backward_weights (dilated, or no JIT kernel fits) crashed off its thread, and gemm:jit
    // backward_data (a dilated ConvolutionBackwardData, the default forward lowering)
    // returned invalid_arguments there (fuzz/threads.py)
    auto global_scratchpad = [](const std::string &kind) {
        return kind == "ConvolutionBackwardData" || kind == "ConvolutionBackwardWeights" ||
               kind == "ConvTransposeBackwardData" || kind == "ConvTransposeBackwardWeights";
    };
    thread_bound_ = global_scratchpad(k);
    for (const auto &node : spec_.nodes) thread_bound_ = thread_bound_ || global_scratchpad(node.kind);
    owner_ = thread_token();
    threads_ = omp_threads();
    id_ = next_op_id.fetch_add(1);
    alive_ = std::make_shared<int>(0);
    empty_my_graves(owner_);
    key_hash_ = std::hash<std::string>{}(spec_.key());
}

void CompiledOp::build_stage(size_t first, size_t end, const std::vector<lt> &inputs, const std::vector<lt> &outputs) {
    const std::string &k = spec_.kind;
    dg::graph g(dnnl::engine::kind::cpu);
    const bool single = spec_.nodes.empty();
    for (size_t n = first; n < end; ++n) {
        const std::string &kind = single ? k : spec_.nodes[n].kind;
        std::vector<lt> in;
        if (single) in = inputs;  // without a host bias (see the constructor)
        else
            for (auto ref : spec_.nodes[n].inputs) in.push_back(ref >= 0 ? inputs[ref] : outputs[-1 - ref]);
        dg::op op(n, to_op_kind(kind), in, {outputs[n]}, kind);
        set_attrs(op, kind, single ? spec_.attrs : spec_.nodes[n].attrs);
        g.add_op(op);
    }
    g.finalize();
    auto partitions = g.get_partitions();
    // The first stage (the graph, without stages) must be one partition. A later stage holds
    // only what follows the op (bias and post-ops), a chain: it may be several partitions,
    // each taking the previous one's result.
    const bool chain = first > 0;
    bool ok = !partitions.empty() && (chain || partitions.size() == 1);
    for (const auto &part : partitions) ok = ok && part.is_supported() && part.get_output_ports().size() == 1;
    if (!ok) {
        std::string what = ": no supported partition";
        if (!single)
            what = ": the library does not fuse this graph into one partition (" + std::to_string(partitions.size()) +
                   " partitions)";
        // dnnl::error keeps the pointer it is given: the text must outlive the exception
        thread_local std::string message;
        message = k + what;
        throw dnnl::error(dnnl_unimplemented, message.c_str());
    }
    // in an order where each partition comes after those whose results it takes
    std::vector<dg::partition> pending(partitions.begin(), partitions.end());
    auto available = [&](const lt &port) {
        return produced_.count(port.get_id()) > 0 ||
               std::any_of(inputs.begin(), inputs.end(), [&](const lt &t) { return t.get_id() == port.get_id(); });
    };
    while (!pending.empty()) {
        auto ready = std::find_if(pending.begin(), pending.end(), [&](const dg::partition &part) {
            const auto ports = part.get_input_ports();
            return std::all_of(ports.begin(), ports.end(), available);
        });
        if (ready == pending.end())
            invalid(k, "a partition takes a tensor that is neither a graph input nor an earlier partition's result");
        const dg::partition part = *ready;
        pending.erase(ready);
        Stage stage;
        // the partition's input ports in its own order (a fused graph's may differ from ours)
        for (const auto &port : part.get_input_ports()) {
            auto made = produced_.find(port.get_id());
            if (made != produced_.end()) {
                stage.sources.push_back(-1 - made->second);
                stage.input_lts.push_back(stages_[static_cast<size_t>(made->second)].output_lt);
                continue;
            }
            auto it = std::find_if(inputs.begin(), inputs.end(),
                                   [&](const lt &t) { return t.get_id() == port.get_id(); });
            stage.sources.push_back(static_cast<int64_t>(it - inputs.begin()));
            stage.input_lts.push_back(*it);
        }
        const size_t out_id = part.get_output_ports()[0].get_id();
        auto node = std::find_if(outputs.begin() + first, outputs.begin() + end,
                                 [&](const lt &t) { return t.get_id() == out_id; });
        if (node == outputs.begin() + end) invalid(k, "a partition writes a tensor outside its stage");
        const size_t n = static_cast<size_t>(node - outputs.begin());
        stage.output_lt = *node;
        stage.output = n + 1 == outputs.size() ? spec_.output : spec_.nodes[n].output;
        stage.compiled = part.compile(stage.input_lts, {stage.output_lt}, cpu_engine());
        for (const auto &pair : stage.compiled.get_inplace_ports()) {
            auto made = produced_.find(pair.first);
            if (pair.second == out_id && made != produced_.end()) stage.in_place_source = made->second;
        }
        produced_[out_id] = static_cast<int64_t>(stages_.size());
        stages_.push_back(std::move(stage));
    }
    if (!produced_.count(outputs[end - 1].get_id())) invalid(k, "a stage's partitions do not end at its last node");
}

namespace {

size_t byte_size(const TensorDesc &d) {
    const size_t item = (d.dtype == "u8" || d.dtype == "s8") ? 1 : (d.dtype == "bf16" || d.dtype == "f16") ? 2 : 4;
    size_t last = 0;
    for (size_t i = 0; i < d.shape.size(); ++i) last += static_cast<size_t>(d.shape[i] - 1) * static_cast<size_t>(d.strides[i]);
    return (last + 1) * item;
}

bool overlaps(const void *a, size_t a_size, const void *b, size_t b_size) {
    auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return x < y + b_size && y < x + a_size;
}

}  // namespace

// Bytes of stage results a thread keeps between runs (per buffer) rather than freeing.
constexpr size_t kKeptScratch = size_t{64} << 20;

ScratchBuffer::ScratchBuffer(ScratchBuffer &&other) noexcept : data_(other.data_), capacity_(other.capacity_) {
    other.data_ = nullptr;
    other.capacity_ = 0;
}

ScratchBuffer &ScratchBuffer::operator=(ScratchBuffer &&other) noexcept {
    if (this != &other) {
        std::free(data_);
        data_ = other.data_;
        capacity_ = other.capacity_;
        other.data_ = nullptr;
        other.capacity_ = 0;
    }
    return *this;
}

ScratchBuffer::~ScratchBuffer() { std::free(data_); }

void *ScratchBuffer::reserve(size_t bytes) {
    if (data_ != nullptr && bytes <= capacity_) return data_;
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    // aligned_alloc takes a multiple of the alignment; an empty result still gets memory
    // (a valid address for the library, as the std::vector this replaced gave)
    const size_t size = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
    void *p = aligned_block(align, size);  // from kHugePage bytes, aligned to (and offered) huge pages
    if (p == nullptr) throw HostAllocationFailed(size);  // (CompiledOp::execute names the op)
    std::free(data_);
    data_ = p;
    capacity_ = size;
    return data_;
}

void ScratchBuffer::release_if_above(size_t bytes) {
    if (capacity_ > bytes) {
        std::free(data_);
        data_ = nullptr;
        capacity_ = 0;
    }
}

void *CompiledOp::stage_target(size_t s, const std::vector<void *> &inputs, void *output,
                               ScratchBuffer &scratch) const {
    const TensorDesc &d = stages_[s].output;
    bool direct = stages_[s].to_output;
    const size_t out_size = byte_size(spec_.output);
    for (size_t later = s + 1; direct && later < stages_.size(); ++later)
        for (int64_t src : stages_[later].sources)
            if (src >= 0 && overlaps(inputs[src], byte_size(spec_.inputs[src]), output, out_size)) direct = false;
    if (direct) return output;
    return scratch.reserve(byte_size(d));
}

dnnl::stream &thread_stream() {
    thread_local dnnl::stream stream(cpu_engine());
    return stream;
}

CompiledOp::~CompiledOp() {
    ForkGate gate;
    if (thread_bound_ && thread_token() != owner_) {  // its own thread destroys it (thread_bound_)
        auto stages = std::make_shared<std::vector<Stage>>(std::move(stages_));
        std::lock_guard<std::mutex> lock(graveyard().mutex);
        if (graveyard().alive.count(owner_)) {
            graveyard().graves[owner_].push_back(std::move(stages));
            ++graveyard().pending;
        } else {  // that thread is gone: destroyed anywhere, the kernel would free another
            // thread's scratchpad, so it is kept (a leak, where a crash was)
            ++graveyard().orphans;
            new std::shared_ptr<std::vector<Stage>>(std::move(stages));
        }
        return;
    }
    with_teardown_lock([&] {
        for (Stage &stage : stages_) stage.compiled = dg::compiled_partition();
    });
}

void CompiledOp::execute(const std::vector<void *> &inputs, void *output) const {
    ForkGate gate;
    if (thread_bound_ && thread_token() != owner_) {  // this thread's own copy (see thread_bound_)
        teardown_unlock();
        ThreadCopies &copies = thread_life().copies;
        copies.sweep();
        std::shared_ptr<const CompiledOp> mine;
        auto it = copies.by_op.find(id_);
        if (it != copies.by_op.end()) {
            mine = it->second.second;
        } else {
            // compiled on this thread, for the thread count of the first compile (the same
            // split of the work: the same bits)
            const int before = omp_threads();
            set_omp_threads(threads_);
            try {
                mine = std::make_shared<const CompiledOp>(spec_, true);
            } catch (...) {
                set_omp_threads(before);
                throw;
            }
            set_omp_threads(before);
            copies.by_op.emplace(id_, std::make_pair(std::weak_ptr<int>(alive_), mine));
        }
        mine->execute(inputs, output);
        return;
    }
    empty_my_graves(thread_token());
    if (ThreadCopies &copies = thread_life().copies; !copies.by_op.empty()) copies.sweep();
    teardown_unlock();
    dnnl::stream &stream = thread_stream();
    std::unique_lock<std::mutex> lock;
    if (serialized_) lock = std::unique_lock<std::mutex>(execution_locks[key_hash_ % kLockStripes]);
    // results that cannot live in the output, one buffer per partition: kept by the thread
    // for its next run (freed past kKeptScratch)
    thread_local std::vector<ScratchBuffer> scratch;
    if (scratch.size() < stages_.size()) scratch.resize(stages_.size());
    std::vector<void *> results(stages_.size(), nullptr);
    // the host bias, read before the partitions write the output (which it may overlap)
    thread_local std::vector<float> bias;
    if (spec_.bias_axis >= 0) {
        const TensorDesc &b = spec_.inputs.back();
        const auto *values = static_cast<const float *>(inputs.back());
        bias.resize(static_cast<size_t>(b.shape[0]));
        for (size_t i = 0; i < bias.size(); ++i) bias[i] = values[static_cast<int64_t>(i) * b.strides[0]];
    }
    try {
        for (size_t s = 0; s < stages_.size(); ++s) {
            const Stage &stage = stages_[s];
            std::vector<dg::tensor> in;
            in.reserve(stage.sources.size());
            for (size_t i = 0; i < stage.sources.size(); ++i) {
                const int64_t src = stage.sources[i];
                in.emplace_back(stage.input_lts[i], cpu_engine(), src >= 0 ? inputs[src] : results[-1 - src]);
            }
            void *target = s + 1 == stages_.size() ? output : stage_target(s, inputs, output, scratch[s]);
            std::vector<dg::tensor> out{dg::tensor(stage.output_lt, cpu_engine(), target)};
            stage.compiled.execute(stream, in, out);
            stream.wait();
            results[s] = target;
        }
        for (auto &buffer : scratch) buffer.release_if_above(kKeptScratch);
        if (spec_.bias_axis >= 0)
            add_bias(spec_.output, static_cast<float *>(output), bias, static_cast<size_t>(spec_.bias_axis));
    } catch (const HostAllocationFailed &e) {
        arm_teardown_lock();
        throw ExecutionOutOfMemory(spec_.kind + ": oneDNN could not allocate the " + std::to_string(e.bytes) +
                                   " bytes of working memory this call needs (out of memory, or at the process's " +
                                   "address-space limit, ulimit -v); the output holds no result");
    } catch (const dnnl::error &e) {
        // an allocation of the library's own (not through the engine's allocator) failed: it
        // reports the status, and the call is refused as one of ours is
        arm_teardown_lock();
        if (e.status != dnnl_out_of_memory) throw;
        throw ExecutionOutOfMemory(spec_.kind + ": oneDNN ran out of memory running this call (" + e.what() +
                                   "; out of memory, or at the process's address-space limit, ulimit -v); " +
                                   "the output holds no result");
    } catch (...) {
        arm_teardown_lock();
        throw;
    }
    arm_teardown_lock();  // after the run that made the library's thread-local table
}

}  // namespace onednn_convt
