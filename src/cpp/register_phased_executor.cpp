// PhasedExecutor: the per-call fast path of a call made of several library ops (see the
// struct's comment).
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "convert.hpp"
#include "gil.hpp"
#include "staging.hpp"

namespace onednn_convt {
namespace {

// One array of the call, or its result, as the plan was made for it.
struct Layout {
    py::dtype dtype;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;  // in bytes, none negative

    // Bytes from the first element to one past the last (the shape holds no 0).
    int64_t extent() const {
        int64_t hi = dtype.itemsize();
        for (size_t i = 0; i < shape.size(); ++i) hi += (shape[i] - 1) * strides[i];
        return hi;
    }

    bool dense() const { return is_c_dense(shape, strides, dtype.itemsize()); }

    // Whether h is an array laid out as this one: dtype, shape, the strides of every dim of
    // more than one element, and aligned.
    bool matches(const py::handle &h) const {
        if (!py::isinstance<py::array>(h)) return false;
        auto a = py::reinterpret_borrow<py::array>(h);
        if (static_cast<size_t>(a.ndim()) != shape.size() || !a.dtype().equal(dtype)) return false;
        for (size_t i = 0; i < shape.size(); ++i)
            if (a.shape(i) != shape[i] || (shape[i] != 1 && a.strides(i) != strides[i])) return false;
        return reinterpret_cast<uintptr_t>(a.data()) % dtype.itemsize() == 0;
    }
};

Layout to_layout(const py::tuple &t) {
    if (t.size() != 3) throw std::invalid_argument("PhasedExecutor: a layout is (dtype, shape, strides in bytes)");
    Layout l{py::dtype::from_args(t[0]), t[1].cast<std::vector<int64_t>>(), t[2].cast<std::vector<int64_t>>()};
    if (l.shape.size() != l.strides.size())
        throw std::invalid_argument("PhasedExecutor: one stride per dim expected");
    for (size_t i = 0; i < l.shape.size(); ++i)
        if (l.shape[i] <= 0 || l.strides[i] < 0)
            throw std::invalid_argument("PhasedExecutor: arrays must be non-empty, with no negative stride");
    return l;
}

// One step of the call: a library op and where each of its tensors starts, or (zeros) a
// window of the result set to zeros.
struct Step {
    PyCompiledOp compiled;
    std::vector<int64_t> sources;  // per library input: the call input it reads, or -1: the result
    std::vector<int64_t> offsets;  // per library input: bytes from the start of that array
    int64_t out_offset;            // bytes from the start of the result
    // indices along the output's first axis whose values the step must leave as they were
    // (Python's Phase.zero: planes of a sum that the op's result must not reach): saved
    // before the op runs and put back after it
    std::vector<int64_t> keep;
    // a step that fills a window of the result with zeros instead (no op): its shape and
    // strides in bytes, from out_offset, of elements of `item` bytes
    bool zeros = false;
    std::vector<int64_t> zero_shape, zero_strides;
    int64_t item = 0;
};

// Sets a strided block of `shape` (strides in bytes) to zero bits (+0.0), the innermost dim
// in one run where it is contiguous.
void zero_block(char *to, const int64_t *shape, const int64_t *strides, size_t dims, int64_t item) {
    if (dims == 0) {
        std::memset(to, 0, static_cast<size_t>(item));
        return;
    }
    if (dims == 1 && strides[0] == item) {
        std::memset(to, 0, static_cast<size_t>(shape[0] * item));
        return;
    }
    for (int64_t i = 0; i < shape[0]; ++i) zero_block(to + i * strides[0], shape + 1, strides + 1, dims - 1, item);
}

// Copies a strided block of `shape` (strides in bytes on both sides) from `from` to `to`,
// the innermost dim in one run where it is contiguous on both sides.
void copy_block(const char *from, char *to, const int64_t *shape, const int64_t *from_strides,
                const int64_t *to_strides, size_t dims, int64_t item) {
    if (dims == 0) {
        std::memcpy(to, from, static_cast<size_t>(item));
        return;
    }
    if (dims == 1 && from_strides[0] == item && to_strides[0] == item) {
        std::memcpy(to, from, static_cast<size_t>(shape[0] * item));
        return;
    }
    for (int64_t i = 0; i < shape[0]; ++i)
        copy_block(from + i * from_strides[0], to + i * to_strides[0], shape + 1, from_strides + 1, to_strides + 1,
                   dims - 1, item);
}

// The planes `keep` of a step's output (as compiled: shape and strides in elements), moved
// between the result at `out` and a dense buffer (saved: result -> buffer; else back).
void move_planes(const Step &s, char *out, std::vector<char> &buffer, bool save) {
    const auto &d = s.compiled.op->spec().output;
    const auto item = static_cast<int64_t>(itemsize_of(d.dtype));
    const size_t dims = d.shape.size() - 1;
    std::vector<int64_t> strides(dims), dense(dims);
    int64_t plane = item;
    for (size_t i = dims; i-- > 0;) {
        strides[i] = d.strides[i + 1] * item;
        dense[i] = plane;
        plane *= d.shape[i + 1];
    }
    if (save) buffer.resize(static_cast<size_t>(plane) * s.keep.size());
    for (size_t j = 0; j < s.keep.size(); ++j) {
        char *at = out + s.keep[j] * d.strides[0] * item;
        char *kept = buffer.data() + static_cast<int64_t>(j) * plane;
        if (save)
            copy_block(at, kept, d.shape.data() + 1, strides.data(), dense.data(), dims, item);
        else
            copy_block(kept, at, d.shape.data() + 1, dense.data(), strides.data(), dims, item);
    }
}

// Bytes from a tensor's first element to one past its last, as compiled (shape and strides
// in elements); -1 where a stride is negative.
int64_t tensor_extent(const TensorDesc &d) {
    const auto item = static_cast<int64_t>(itemsize_of(d.dtype));
    int64_t hi = item;
    for (size_t i = 0; i < d.shape.size(); ++i) {
        if (d.shape[i] == 0) return 0;
        if (d.strides[i] < 0) return -1;
        hi += (d.shape[i] - 1) * d.strides[i] * item;
    }
    return hi;
}

// The per-call fast path of a call made of several library ops on views of the call's
// arrays and of its result: a polyphase lowering's phases, a depth-taps or per-group
// lowering's parts (Python's PhasedPlan, of those whose every step writes its window, or
// adds to it in the library, with nothing but zero fills between the steps). Each step is
// one compiled op whose tensors start at fixed byte offsets from a call array or from the
// result (a BiasAdd over the result among them), or a window of the result zeroed; a call
// whose arrays are laid out as the plan's were (dtype, shape, strides, alignment) runs every
// step in order with the GIL released and no Python between them. Anything else raises
// SignatureMismatch, and the Python layer takes its full path. The Python layer gives the
// offsets (from the views the steps were compiled for); the constructor checks that each
// step's tensors lie within their arrays, so that no call that matches reads or writes
// outside them. With finite_code set ("bf16"/"f16"), a result holding an Inf or NaN raises
// SignatureMismatch after the run (as Executor's does: the Python layer redoes the call).
struct PhasedExecutor {
    std::vector<Step> steps;
    std::vector<Layout> inputs;  // the call's arrays, as run() and run_pointers() take them
    Layout output;               // the result, as run() returns it
    bool dense_output;
    std::string finite_code;
    // "" or the call's dtype code ("bf16"/"f16") where the steps run in f32 (Python's
    // emulated PhasedPlan): each input is converted into the thread's staging memory as a
    // dense f32 array, the steps run on those into a dense f32 result there, which is
    // rounded into the output (dense). The steps' offsets are into those f32 arrays, and
    // were checked against their layouts when the f32 executor was made (emulating()).
    std::string emulated;
    std::vector<size_t> staged_offsets;  // emulated: each input's, then the result's, in floats
    size_t staged_total = 0;

    // Runs every step on the call's arrays at `bases` into the result at `result`. No GIL.
    bool run_steps(const std::vector<char *> &bases, char *result) const {
        std::vector<void *> ptrs;
        std::vector<char> kept;
        for (const auto &s : steps) {
            if (s.zeros) {
                zero_block(result + s.out_offset, s.zero_shape.data(), s.zero_strides.data(), s.zero_shape.size(), s.item);
                continue;
            }
            ptrs.resize(s.sources.size());
            for (size_t k = 0; k < s.sources.size(); ++k)
                ptrs[k] = (s.sources[k] < 0 ? result : bases[static_cast<size_t>(s.sources[k])]) + s.offsets[k];
            if (!s.keep.empty()) move_planes(s, result + s.out_offset, kept, true);
            s.compiled.op->execute(ptrs, result + s.out_offset);
            if (!s.keep.empty()) move_planes(s, result + s.out_offset, kept, false);
        }
        if (finite_code.empty()) return true;
        size_t size = 1;
        for (auto n : output.shape) size *= static_cast<size_t>(n);
        return all_finite_16(reinterpret_cast<const uint16_t *>(result), size, finite_code);
    }

    static size_t elements(const Layout &l) {
        size_t n = 1;
        for (auto x : l.shape) n *= static_cast<size_t>(x);
        return n;
    }

    // Emulated: converts the inputs at `bases` into staging memory, runs the steps there and
    // rounds the f32 result into `dst` (dense). No GIL.
    void run_emulated(const std::vector<char *> &bases, char *dst) const {
        const LowType type = emulated == "f16" ? LowType::f16 : LowType::bf16;
        Staging &staging = Staging::local();
        float *base = staging.get(staged_total);
        try {
            std::vector<char *> f32(bases.size());
            for (size_t i = 0; i < bases.size(); ++i) {
                float *to = base + staged_offsets[i];
                const auto *low = reinterpret_cast<const uint16_t *>(bases[i]);
                if (inputs[i].dense()) {
                    low_to_f32(low, to, elements(inputs[i]), type);
                } else {
                    std::vector<int64_t> strides;
                    for (auto st : inputs[i].strides) strides.push_back(st / 2);
                    low_to_f32_strided(low, inputs[i].shape, strides, to, type);
                }
                f32[i] = reinterpret_cast<char *>(to);
            }
            float *result = base + staged_offsets.back();
            run_steps(f32, reinterpret_cast<char *>(result));
            f32_to_low(result, reinterpret_cast<uint16_t *>(dst), elements(output), type);
        } catch (...) {
            staging.release();
            throw;
        }
        staging.release();
    }

    // Runs the call on the arrays at `bases` into `dst`; false: a guarded result holds an
    // Inf or NaN. No GIL.
    bool run_call(const std::vector<char *> &bases, char *dst) const {
        if (emulated.empty()) return run_steps(bases, dst);
        run_emulated(bases, dst);
        return true;
    }

    py::array run(const py::tuple &call, const py::object &out) const {
        if (call.size() != inputs.size()) throw SignatureMismatch();
        std::vector<char *> bases(inputs.size());
        for (size_t i = 0; i < inputs.size(); ++i) {
            if (!inputs[i].matches(call[i])) throw SignatureMismatch();
            bases[i] = static_cast<char *>(const_cast<void *>(py::reinterpret_borrow<py::array>(call[i]).data()));
        }
        py::array result;
        if (out.is_none()) {
            if (!dense_output) throw SignatureMismatch();
            result = host_array(output.dtype, {output.shape.begin(), output.shape.end()});
        } else {
            if (!output.matches(out)) throw SignatureMismatch();
            result = py::reinterpret_borrow<py::array>(out);
            if (!result.writeable()) throw SignatureMismatch();
            auto [lo, hi] = address_range(result);
            for (size_t i = 0; i < inputs.size(); ++i) {
                auto [a, b] = address_range(py::reinterpret_borrow<py::array>(call[i]));
                if (a < hi && lo < b) throw SignatureMismatch();
            }
        }
        char *dst = static_cast<char *>(result.mutable_data());
        if (!without_gil([&] { return run_call(bases, dst); })) throw SignatureMismatch();
        return result;
    }

    // The same run on raw addresses (integers) in the call's order into a dense result the
    // caller allocated at `out`. The caller vouches that each address starts memory laid
    // out as the plan's arrays were (the torch path keys its executors on the tensors'
    // shapes, strides and dtypes); alignment and the result's density are checked.
    void run_pointers(const std::vector<uintptr_t> &call, uintptr_t out) const {
        if (call.size() != inputs.size() || !dense_output || out == 0) throw SignatureMismatch();
        std::vector<char *> bases(inputs.size());
        for (size_t i = 0; i < inputs.size(); ++i) {
            if (call[i] == 0 || call[i] % static_cast<uintptr_t>(inputs[i].dtype.itemsize()) != 0)
                throw SignatureMismatch();
            bases[i] = reinterpret_cast<char *>(call[i]);
        }
        if (out % static_cast<uintptr_t>(output.dtype.itemsize()) != 0) throw SignatureMismatch();
        char *dst = reinterpret_cast<char *>(out);
        if (!without_gil([&] { return run_call(bases, dst); })) throw SignatureMismatch();
    }

    // This executor's steps on 16-bit arrays of `call` layouts (their shapes this one's,
    // any non-negative strides) into a dense 16-bit result: this one must run on dense f32
    // arrays and a dense f32 result (an emulated plan's f32 phases).
    PhasedExecutor emulating(const py::sequence &call, const py::tuple &result, const std::string &code) const {
        if (!emulated.empty() || !finite_code.empty() || (code != "bf16" && code != "f16") || !fast_conversion())
            throw std::invalid_argument("PhasedExecutor: emulation needs an f32 executor, bf16 or f16, AVX2 and F16C");
        PhasedExecutor e = *this;
        e.emulated = code;
        e.inputs.clear();
        for (auto t : call) e.inputs.push_back(to_layout(t.cast<py::tuple>()));
        e.output = to_layout(result);
        e.dense_output = e.output.dense();
        auto f32 = [](const Layout &l) { return l.dtype.itemsize() == 4 && l.dense(); };
        auto low = [&](const Layout &l) { return l.dtype.itemsize() == 2 && (l.dtype.num() == 23) == (code == "f16"); };
        bool ok = e.inputs.size() == inputs.size() && f32(output) && low(e.output) && e.dense_output &&
                  e.output.shape == output.shape;
        for (size_t i = 0; ok && i < inputs.size(); ++i)
            ok = f32(inputs[i]) && low(e.inputs[i]) && e.inputs[i].shape == inputs[i].shape;
        if (!ok) throw std::invalid_argument("PhasedExecutor: emulation needs dense f32 steps and 16-bit arrays of their shapes");
        e.staged_offsets.clear();
        e.staged_total = 0;
        for (const auto &l : inputs) {
            e.staged_offsets.push_back(e.staged_total);
            e.staged_total += aligned_floats(elements(l));
        }
        e.staged_offsets.push_back(e.staged_total);
        e.staged_total += aligned_floats(elements(output));
        return e;
    }
};

// Whether `bytes` of a tensor from `offset` lie within an array of `extent` bytes.
bool within(int64_t offset, int64_t bytes, int64_t extent) {
    return offset >= 0 && bytes >= 0 && offset + bytes <= extent;
}

}  // namespace

void register_phased_executor(py::module_ &m) {
    py::class_<PhasedExecutor>(m, "PhasedExecutor")
            .def(py::init([](const py::sequence &steps, const py::sequence &inputs, const py::tuple &output,
                             std::string finite_code) {
                     PhasedExecutor e{{}, {}, to_layout(output), false, std::move(finite_code)};
                     for (auto t : inputs) e.inputs.push_back(to_layout(t.cast<py::tuple>()));
                     e.dense_output = e.output.dense();
                     const auto out_extent = e.output.extent();
                     for (auto h : steps) {
                         auto t = h.cast<py::tuple>();
                         if (t.size() == 3) {  // zeros: (offset, shape, strides in bytes)
                             Step z{};
                             z.zeros = true;
                             z.out_offset = t[0].cast<int64_t>();
                             z.zero_shape = t[1].cast<std::vector<int64_t>>();
                             z.zero_strides = t[2].cast<std::vector<int64_t>>();
                             z.item = e.output.dtype.itemsize();
                             int64_t bytes = z.item;
                             bool empty = false, ok = z.zero_shape.size() == z.zero_strides.size();
                             for (size_t i = 0; ok && i < z.zero_shape.size(); ++i) {
                                 ok = z.zero_shape[i] >= 0 && z.zero_strides[i] >= 0;
                                 empty = empty || z.zero_shape[i] == 0;
                                 if (ok && z.zero_shape[i] > 0) bytes += (z.zero_shape[i] - 1) * z.zero_strides[i];
                             }
                             if (!ok || !within(z.out_offset, empty ? 0 : bytes, out_extent))
                                 throw std::invalid_argument("PhasedExecutor: a zeroed window lies outside the result");
                             e.steps.push_back(std::move(z));
                             continue;
                         }
                         if (t.size() != 5)
                             throw std::invalid_argument(
                                     "PhasedExecutor: a step is (compiled, sources, offsets, out_offset, keep)");
                         Step s{};
                         s.compiled = t[0].cast<PyCompiledOp>();
                         s.sources = t[1].cast<std::vector<int64_t>>();
                         s.offsets = t[2].cast<std::vector<int64_t>>();
                         s.out_offset = t[3].cast<int64_t>();
                         s.keep = t[4].cast<std::vector<int64_t>>();
                         const auto &spec = s.compiled.op->spec();
                         for (auto k : s.keep)
                             if (spec.output.shape.empty() || k < 0 || k >= spec.output.shape[0] ||
                                 tensor_extent(spec.output) < 0)
                                 throw std::invalid_argument("PhasedExecutor: a kept plane is outside the step's output");
                         if (s.sources.size() != spec.inputs.size() || s.offsets.size() != spec.inputs.size())
                             throw std::invalid_argument("PhasedExecutor: one source and offset per library input expected");
                         for (size_t k = 0; k < s.sources.size(); ++k) {
                             const auto src = s.sources[k];
                             if (src < -1 || src >= static_cast<int64_t>(e.inputs.size()))
                                 throw std::invalid_argument("PhasedExecutor: a source is a call input or -1 (the result)");
                             const Layout &from = src < 0 ? e.output : e.inputs[static_cast<size_t>(src)];
                             if (static_cast<size_t>(from.dtype.itemsize()) != itemsize_of(spec.inputs[k].dtype) ||
                                 !within(s.offsets[k], tensor_extent(spec.inputs[k]), from.extent()))
                                 throw std::invalid_argument("PhasedExecutor: a step's input lies outside its array");
                         }
                         if (static_cast<size_t>(e.output.dtype.itemsize()) != itemsize_of(spec.output.dtype) ||
                             !within(s.out_offset, tensor_extent(spec.output), out_extent))
                             throw std::invalid_argument("PhasedExecutor: a step's output lies outside the result");
                         e.steps.push_back(std::move(s));
                     }
                     if (!e.finite_code.empty() &&
                         (!e.dense_output || (e.finite_code != "bf16" && e.finite_code != "f16") ||
                          e.output.dtype.itemsize() != 2 || !fast_conversion()))
                         throw std::invalid_argument("PhasedExecutor: finite_code needs a dense bf16 or f16 result");
                     return e;
                 }),
                 py::arg("steps"), py::arg("inputs"), py::arg("output"), py::arg("finite_code") = "",
                 "steps: (compiled op, per library input the call input it reads or -1 for the\n"
                 "result, per library input its byte offset there, the output's byte offset in the\n"
                 "result, the indices along the output's first axis the step leaves as they were),\n"
                 "or (byte offset, shape, strides in bytes) of a window of the result set to zeros;\n"
                 "inputs and output: (dtype, shape, strides in bytes) as the plan was made.")
            .def("run", &PhasedExecutor::run, py::arg("inputs"), py::arg("out"),
                 "Run every step on arrays laid out as the plan's, else raise SignatureMismatch.")
            .def("run_pointers", &PhasedExecutor::run_pointers, py::arg("inputs"), py::arg("out"),
                 "Run every step on raw addresses laid out as the plan's arrays into a dense result\n"
                 "at `out`; misaligned addresses, or a guarded result holding an Inf or NaN (after\n"
                 "the run), raise SignatureMismatch.")
            .def("emulating", &PhasedExecutor::emulating, py::arg("inputs"), py::arg("output"), py::arg("code"),
                 "This f32 executor's steps on bf16/f16 arrays of these layouts (dtype, shape, strides\n"
                 "in bytes), converted to f32 in staging memory, the result rounded into `output`.")
            .def_property_readonly("output_shape", [](const PhasedExecutor &e) { return e.output.shape; })
            .def_property_readonly("dense_output", [](const PhasedExecutor &e) { return e.dense_output; })
            .def_property_readonly("steps", [](const PhasedExecutor &e) { return e.steps.size(); });
}

}  // namespace onednn_convt
