// One oneDNN Graph op, or a chain of ops the library fuses into one partition (a
// ConvTranspose with its bias, post-ops and (de)quantization), compiled for the CPU engine
// and run on caller-owned memory.
//
// The caller (the Python layer) has already resolved every attribute: this file knows no
// defaults and no spec spellings. It still refuses arguments that would crash oneDNN 3.2
// (never trust the caller): see check_arguments in compiled_op.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <unordered_map>
#include <string>
#include <variant>
#include <vector>

#include "oneapi/dnnl/dnnl_graph.hpp"

namespace onednn_convt {

using Dims = std::vector<int64_t>;
using Floats = std::vector<double>;  // f32 attributes (alpha, scales, ...) as Python gives them
using AttrValue = std::variant<int64_t, Dims, std::string, double, Floats>;
using Attrs = std::map<std::string, AttrValue>;  // ordered: part of the cache key

// An execution whose memory the host allocator could not give (HostAllocationFailed in
// host_memory.hpp), or that the library refused as out of memory (an allocation of its own);
// the binding raises it as Python's MemoryError.
struct ExecutionOutOfMemory : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A strided tensor as the caller will pass it: shape and strides in elements.
struct TensorDesc {
    Dims shape;
    Dims strides;
    std::string dtype;  // "f32", "bf16", "f16", "s32", "u8", "s8"
};

// One op of a fused graph. Its inputs are the graph's inputs (index >= 0) or the outputs of
// earlier nodes (index -1 - k for node k); its output is an intermediate tensor, except for
// the last node's, which is the graph's output.
struct NodeSpec {
    std::string kind;
    Attrs attrs;
    std::vector<int64_t> inputs;
    TensorDesc output;
};

// What identifies a compiled partition: everything that changes the compiled code.
struct OpSpec {
    std::string kind;  // library op kind: "ConvTranspose", "Convolution", ... (a graph: its name)
    Attrs attrs;  // the op's attributes (a graph: empty, each node has its own)
    std::vector<TensorDesc> inputs;
    TensorDesc output;
    // Inputs whose values the caller promises never change: the library reorders them on
    // the first run only and keeps the result in its constant tensor cache, which belongs
    // to the compiled partition. So an op with constant inputs serves one set of values:
    // register_compiled_op.cpp compiles it outside PartitionCache, and CompiledOp gives its logical
    // tensors ids no other compile uses.
    std::vector<size_t> constant_inputs;
    // Empty: one op `kind` over `inputs`. Else the graph these nodes make, which must compile
    // into one partition; the last node writes `output`.
    std::vector<NodeSpec> nodes;
    // Node indices (ascending, > 0) where a new stage of the graph begins. Each stage is
    // compiled as a graph of its own (one partition each) and the stages run in order; a
    // stage's nodes take graph inputs, earlier nodes of the stage, or the previous stage's
    // result. Empty: one stage. Used to keep a library op apart from what follows it where
    // the fused kernel computes that wrongly (the Python layer's guards say where).
    std::vector<size_t> stage_starts;
    // >= 0: the last input is a bias (1-D, f32, one value per entry of the output's dim
    // `bias_axis`) that no partition takes: execute adds it to the output after the
    // partitions ran. Where the library's biased kernel is slow on small problems (the
    // Python layer says where), a plain loop over a small output is cheaper. -1: none.
    int64_t bias_axis = -1;

    std::string key() const;
};

// Memory for one partition's result between partitions: 64-byte aligned, not zeroed, kept
// by its thread between runs up to a size. Buffers of 2 MiB and more are aligned to 2 MiB
// and offered transparent huge pages (madvise), so that a large fresh one costs a few page
// faults rather than one per 4 KiB. Measured on an AMD Zen5 KVM guest, a staged fused call
// (HiFi-GAN k16 s8, f32 NCX, bias + ReLU: two 64 MiB intermediates) with its buffers taken
// afresh on every run: 187 ms zeroed in 4 KiB pages (a std::vector), 162 ms not zeroed,
// 121-128 ms in huge pages; 114-120 ms with the buffers kept.
class ScratchBuffer {
public:
    ScratchBuffer() = default;
    ScratchBuffer(const ScratchBuffer &) = delete;
    ScratchBuffer &operator=(const ScratchBuffer &) = delete;
    ScratchBuffer(ScratchBuffer &&other) noexcept;
    ScratchBuffer &operator=(ScratchBuffer &&other) noexcept;
    ~ScratchBuffer();
    void *reserve(size_t bytes);  // at least `bytes`, contents undefined
    void release_if_above(size_t bytes);
private:
    void *data_ = nullptr;
    size_t capacity_ = 0;
};

class CompiledOp {
public:
    // Builds the graph and compiles; throws on failure. `private_ids`: logical tensor ids no
    // other op has, so that the library's compiled-partition cache cannot hand back another
    // op's kernels (a per-thread copy, see thread_bound_).
    explicit CompiledOp(OpSpec spec, bool private_ids = false);
    ~CompiledOp();  // frees the compiled partitions under the kernel teardown lock (see thread_bound_)

    const OpSpec &spec() const { return spec_; }

    // Runs once on raw pointers laid out as spec().inputs / spec().output. No GIL needed.
    // Thread-safe: kinds the library cannot run concurrently take a lock (see serialized_).
    void execute(const std::vector<void *> &inputs, void *output) const;

    // The caller's inputs the library may read from the output's memory: passing the output
    // buffer as such an input runs in place (a fused Add that the library makes its "sum"
    // post-op; otherwise it first copies that input into the output).
    const std::vector<size_t> &inplace_inputs() const { return inplace_inputs_; }

    // How many partitions (stages) one run executes.
    size_t stages() const { return stages_.size(); }

private:
    // One separately compiled partition of the graph (the stages' partitions, in an order
    // where each comes after those whose results it takes). `sources[i]` says where port i's
    // tensor comes from: a graph input (>= 0) or partition k's result (-1 - k).
    struct Stage {
        dnnl::graph::compiled_partition compiled;
        std::vector<dnnl::graph::logical_tensor> input_lts;  // in the partition's port order
        std::vector<int64_t> sources;
        dnnl::graph::logical_tensor output_lt;
        TensorDesc output;
        // the partition whose result the library may read from this one's output memory (its
        // in-place ports pair them); -1: none
        int64_t in_place_source = -1;
        // whether this partition writes its result into the op's output: the last one, and one
        // whose result has the output's layout and goes, in place, to one later partition only
        // that writes the output too
        bool to_output = false;
    };
    void build_stage(size_t first, size_t end, const std::vector<dnnl::graph::logical_tensor> &inputs,
                     const std::vector<dnnl::graph::logical_tensor> &outputs);
    // Where stage `s` (not the last) writes its result in a run whose output is at `output`:
    // the output itself where Stage::to_output and no later stage reads a graph input that
    // overlaps it, else `scratch` (resized).
    void *stage_target(size_t s, const std::vector<void *> &inputs, void *output, ScratchBuffer &scratch) const;
    // Partition ids of the graph's intermediate results built so far: lt id -> partition index.
    std::unordered_map<size_t, int64_t> produced_;

    OpSpec spec_;
    // oneDNN 3.2's ConvTransposeBackwardWeights and ConvolutionBackwardWeights share their
    // reduction scratchpad (and the barrier in it) between concurrent runs of one compiled
    // partition: wrong values or a thread spinning forever. ConvolutionBackwardData gives
    // wrong values run concurrently too. Such kinds run one thread at a time per spec key.
    bool serialized_ = false;
    // oneDNN 3.2 runs some backward-data and backward-weights partitions (its GEMM kernels,
    // x64:gemm:jit: dilated problems, or where no JIT kernel fits) on the library's global
    // scratchpad: a thread-local buffer with a thread-local reference count, taken by the
    // kernel on the thread that creates it and given back by its destructor on whichever
    // thread runs it. Run on another thread, such a kernel crashes (tests/test_threads.py);
    // destroyed on another thread, it frees that thread's buffer under the kernels still
    // using it (a crash in their next run). So such a kind runs its stages on the thread that
    // compiled them and, on each other thread, a copy compiled there and owned by that
    // thread (destroyed there: when it next runs an op after this one is gone, or when it
    // exits); and stages dropped on another thread wait for their own thread to destroy them
    // (see ~CompiledOp).
    bool thread_bound_ = false;
    uint64_t owner_ = 0;  // the compiling thread (thread_token in compiled_op.cpp)
    int threads_ = 0;  // its OpenMP thread count then (copies are compiled for as many)
    uint64_t id_ = 0;  // this op, among every CompiledOp of the process (copies are found by it)
    std::shared_ptr<int> alive_;  // the threads' copies watch it (weakly) to know this op is gone
    size_t key_hash_ = 0;
    std::vector<Stage> stages_;
    std::vector<size_t> inplace_inputs_;
};

// Held (shared) while a thread is inside the library through this binding; a fork takes it
// exclusively (see before_fork in compiled_op.cpp). Reentrant within a thread.
struct ForkGate {
    ForkGate();
    ~ForkGate();
    ForkGate(const ForkGate &) = delete;
    ForkGate &operator=(const ForkGate &) = delete;
};
std::shared_mutex &fork_gate();
// Whether any thread of this process (or of the parent it was forked from) has entered the
// library through a ForkGate: its OpenMP thread pools may exist.
bool library_entered();

dnnl::engine &cpu_engine();
dnnl::stream &thread_stream();  // one CPU stream per thread

}  // namespace onednn_convt
