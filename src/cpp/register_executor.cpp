// Executor: the per-call fast path of one op object (see the struct's comment).
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "convert.hpp"
#include "gil.hpp"
#include "staging.hpp"

namespace onednn_convt {
namespace {

// The per-call fast path of one op object: a compiled op plus the NumPy dtypes it was
// planned for. It runs only arrays that match the plan exactly (dtype, shape, strides,
// alignment, no overlap between out and the inputs) and allocates the output itself.
// `order` maps the library's inputs to the call's (a lowering may swap them); a call input
// in no order entry (a fused call's missing bias) must be None.
// With finite_code set ("bf16"/"f16"), a result holding an Inf or NaN also raises
// SignatureMismatch after the run, so that the Python layer redoes the call its own way
// (oneDNN 3.2's native low-precision kernels spread non-finite values; see ops.py).
// With emulated set ("bf16"/"f16"), the compiled op is the f32 one of an emulated plan
// (dense inputs and output): the call's bf16/f16 arrays are converted into the thread's
// staging memory, run in f32 and the result rounded into the output. An input may have
// other strides there (`call_strides`, channels-last weights say): the conversion reads them.
struct Executor {
    PyCompiledOp compiled;
    std::vector<py::dtype> input_dtypes;
    std::vector<size_t> order;  // library input i is the call's input order[i]
    size_t call_size;  // the call's inputs, those in `order` and `unused` ones, which must be None
    std::vector<size_t> unused;
    py::dtype output_dtype;
    bool dense_output;  // whether an output it allocates (C order) matches the compiled one
    std::string finite_code;
    std::string emulated;  // "", or the call's dtype code when the op runs in f32
    // emulated: per library input, the call array's strides (in elements) where they are not
    // the dense ones of the compiled f32 input; empty where they are
    std::vector<std::vector<int64_t>> call_strides;
    // per library input, the call array's shape where it is not the compiled one, which
    // it may differ from by dims of size 1 alone (a lifted 1-D call: the library's input
    // is a view of the call's array with a unit axis inserted); empty where it is. The
    // compiled strides (or call_strides) of the other dims are the array's, in order.
    std::vector<std::vector<int64_t>> call_shapes;
    // the result's shape where it is not the compiled output's (differing by dims of size
    // 1 alone, as call_shapes); empty where it is
    std::vector<int64_t> call_out_shape;
    // emulated: element counts of the inputs and the output, and their offsets (in floats,
    // 64-byte aligned) in the staging memory, which holds `staged_total` floats
    std::vector<size_t> staged_sizes, staged_offsets;
    size_t staged_total = 0;

    void plan_staging() {
        const auto &spec = compiled.op->spec();
        auto add = [&](const TensorDesc &d) {
            size_t n = 1;
            for (auto x : d.shape) n *= static_cast<size_t>(x);
            staged_sizes.push_back(n);
            staged_offsets.push_back(staged_total);
            staged_total += aligned_floats(n);
        };
        for (const auto &d : spec.inputs) add(d);
        add(spec.output);
    }

    static bool is_dense(const TensorDesc &d) { return is_c_dense(d.shape, d.strides, 1); }

    // Whether h is an array of dtype and `shape`, aligned, laid out as a tensor of `compiled`
    // shape and `strides` (in elements): the same sizes and strides for every dim of more
    // than one element, in order (a size-1 dim's stride addresses nothing).
    static bool matches(const py::handle &h, const py::dtype &dtype, const std::vector<int64_t> &shape,
                        const std::vector<int64_t> &compiled, const std::vector<int64_t> &strides) {
        if (!py::isinstance<py::array>(h)) return false;
        auto a = py::reinterpret_borrow<py::array>(h);
        if (static_cast<size_t>(a.ndim()) != shape.size() || !a.dtype().equal(dtype)) return false;
        const auto item = a.itemsize();
        size_t j = 0;  // the compiled dim that the array's next dim of more than one element is
        for (size_t i = 0; i < shape.size(); ++i) {
            if (a.shape(i) != shape[i]) return false;
            if (shape[i] == 1) continue;
            while (j < compiled.size() && compiled[j] == 1) ++j;
            if (j == compiled.size() || compiled[j] != shape[i] || a.strides(i) != strides[j] * item) return false;
            ++j;
        }
        return reinterpret_cast<uintptr_t>(a.data()) % item == 0;
    }

    // Whether two shapes differ by dims of size 1 alone.
    static bool same_but_units(const std::vector<int64_t> &a, const std::vector<int64_t> &b) {
        std::vector<int64_t> x, y;
        for (auto n : a)
            if (n != 1) x.push_back(n);
        for (auto n : b)
            if (n != 1) y.push_back(n);
        return x == y;
    }

    // The shape the call's array for library input i has.
    const std::vector<int64_t> &input_shape(size_t i) const {
        return i < call_shapes.size() && !call_shapes[i].empty() ? call_shapes[i] : compiled.op->spec().inputs[i].shape;
    }

    // The shape of the result the call gets.
    const std::vector<int64_t> &result_shape() const {
        return call_out_shape.empty() ? compiled.op->spec().output.shape : call_out_shape;
    }

    // Whether the call's array for library input i has other strides than the compiled one.
    bool strided(size_t i) const { return i < call_strides.size() && !call_strides[i].empty(); }

    // The strides (in elements) the call's array for library input i has.
    const std::vector<int64_t> &input_strides(size_t i) const {
        return strided(i) ? call_strides[i] : compiled.op->spec().inputs[i].strides;
    }

    py::array run(const py::tuple &inputs, const py::object &out) const {
        const auto &spec = compiled.op->spec();
        if (inputs.size() != call_size) throw SignatureMismatch();
        for (size_t i : unused)  // an input this plan was made without (a bias, say)
            if (!inputs[i].is_none()) throw SignatureMismatch();
        std::vector<void *> ptrs(order.size());
        for (size_t i = 0; i < order.size(); ++i) {
            const auto h = inputs[order[i]];
            if (!matches(h, input_dtypes[i], input_shape(i), spec.inputs[i].shape, input_strides(i)))
                throw SignatureMismatch();
            ptrs[i] = const_cast<void *>(py::reinterpret_borrow<py::array>(h).data());
        }
        py::array result;
        if (out.is_none()) {
            if (!dense_output) throw SignatureMismatch();
            result = host_array(output_dtype, {result_shape().begin(), result_shape().end()});
        } else {
            if (!matches(out, output_dtype, result_shape(), spec.output.shape, spec.output.strides))
                throw SignatureMismatch();
            result = py::reinterpret_borrow<py::array>(out);
            if (!result.writeable()) throw SignatureMismatch();
            auto [lo, hi] = address_range(result);
            for (size_t i : order) {
                auto [a, b] = address_range(py::reinterpret_borrow<py::array>(inputs[i]));
                if (a < hi && lo < b) throw SignatureMismatch();
            }
        }
        if (!emulated.empty()) {
            run_emulated(ptrs, static_cast<uint16_t *>(result.mutable_data()));
            return result;
        }
        void *dst = result.mutable_data();
        const auto size = static_cast<size_t>(result.size());
        const bool finite = without_gil([&] {
            compiled.op->execute(ptrs, dst);
            return finite_code.empty() || all_finite_16(static_cast<const uint16_t *>(dst), size, finite_code);
        });
        if (!finite) throw SignatureMismatch();
        return result;
    }

    // The same run on raw addresses (integers) in the call's order, 0 for None, into a
    // dense output the caller allocated at `out`. Nothing here can check what the memory
    // holds: the caller vouches that each address starts memory laid out as compiled (the
    // torch path keys its executors on the tensors' shapes, strides and dtypes). Alignment,
    // the inputs that must be None and the output's density are checked (SignatureMismatch).
    void run_pointers(const std::vector<uintptr_t> &inputs, uintptr_t out) const {
        const auto &spec = compiled.op->spec();
        if (inputs.size() != call_size || !dense_output || out == 0) throw SignatureMismatch();
        for (size_t i : unused)
            if (inputs[i] != 0) throw SignatureMismatch();
        std::vector<void *> ptrs(order.size());
        for (size_t i = 0; i < order.size(); ++i) {
            const uintptr_t p = inputs[order[i]];
            const size_t item = emulated.empty() ? itemsize_of(spec.inputs[i].dtype) : 2;
            if (p == 0 || p % item != 0) throw SignatureMismatch();
            ptrs[i] = reinterpret_cast<void *>(p);
        }
        const size_t out_item = emulated.empty() ? itemsize_of(spec.output.dtype) : 2;
        if (out % out_item != 0) throw SignatureMismatch();
        void *dst = reinterpret_cast<void *>(out);
        size_t size = 1;
        for (auto n : spec.output.shape) size *= static_cast<size_t>(n);
        if (!emulated.empty()) {
            run_emulated(ptrs, static_cast<uint16_t *>(dst));
            return;
        }
        const bool finite = without_gil([&] {
            compiled.op->execute(ptrs, dst);
            return finite_code.empty() || all_finite_16(static_cast<const uint16_t *>(dst), size, finite_code);
        });
        if (!finite) throw SignatureMismatch();
    }

    // Converts the inputs (at ptrs) to f32, runs the f32 op and rounds into dst (dense).
    void run_emulated(const std::vector<void *> &ptrs, uint16_t *dst) const {
        const LowType type = emulated == "f16" ? LowType::f16 : LowType::bf16;
        const auto &spec = compiled.op->spec();
        const auto &sizes = staged_sizes, &offsets = staged_offsets;
        without_gil([&] {
            Staging &staging = Staging::local();
            float *base = staging.get(staged_total);
            std::vector<void *> f32(ptrs.size());
            for (size_t i = 0; i < ptrs.size(); ++i) {
                f32[i] = base + offsets[i];
                const auto *low = static_cast<const uint16_t *>(ptrs[i]);
                if (strided(i))
                    low_to_f32_strided(low, spec.inputs[i].shape, call_strides[i], base + offsets[i], type);
                else
                    low_to_f32(low, base + offsets[i], sizes[i], type);
            }
            float *out = base + offsets.back();
            try {
                compiled.op->execute(f32, out);
            } catch (...) {
                staging.release();
                throw;
            }
            f32_to_low(out, dst, sizes.back(), type);
            staging.release();
        });
    }
};

}  // namespace

void register_executor(py::module_ &m) {
    py::register_exception<SignatureMismatch>(m, "SignatureMismatch");
    py::class_<Executor>(m, "Executor")
            .def(py::init([](const PyCompiledOp &c, std::vector<py::dtype> in, py::dtype out,
                             std::string finite_code, std::vector<size_t> order, std::string emulated,
                             size_t call_size, std::vector<std::vector<int64_t>> call_strides,
                             std::vector<std::vector<int64_t>> call_shapes, std::vector<int64_t> call_out_shape) {
                     const auto &spec = c.op->spec();
                     if (in.size() != spec.inputs.size())
                         throw std::invalid_argument("Executor: one dtype per input expected");
                     if (!call_shapes.empty() && call_shapes.size() != in.size())
                         throw std::invalid_argument("Executor: one call_shapes entry per input expected");
                     for (size_t i = 0; i < call_shapes.size(); ++i)
                         if (!call_shapes[i].empty() && !Executor::same_but_units(call_shapes[i], spec.inputs[i].shape))
                             throw std::invalid_argument("Executor: a call shape may differ from the compiled one by dims of size 1 alone");
                     if (!call_out_shape.empty() && !Executor::same_but_units(call_out_shape, spec.output.shape))
                         throw std::invalid_argument("Executor: the call's output shape may differ from the compiled one by dims of size 1 alone");
                     if (order.empty())
                         for (size_t i = 0; i < in.size(); ++i) order.push_back(i);
                     if (order.size() != in.size())
                         throw std::invalid_argument("Executor: one order entry per input expected");
                     if (call_size == 0) call_size = order.size();
                     // each of the call's inputs taken at most once, none out of range
                     std::vector<bool> seen(call_size, false);
                     for (size_t k : order) {
                         if (k >= call_size || seen[k])
                             throw std::invalid_argument("Executor: order must take each call input at most once");
                         seen[k] = true;
                     }
                     std::vector<size_t> unused;
                     for (size_t k = 0; k < call_size; ++k)
                         if (!seen[k]) unused.push_back(k);
                     const bool dense = Executor::is_dense(spec.output);
                     if (!emulated.empty()) {
                         // f32 op, dense tensors; the call's arrays are all of the emulated type
                         if ((emulated != "bf16" && emulated != "f16") || !finite_code.empty())
                             throw std::invalid_argument("Executor: emulated must be 'bf16' or 'f16', without finite_code");
                         if (!fast_conversion())
                             throw std::invalid_argument("Executor: emulation needs AVX2 and F16C");
                         // f16 is NumPy's half (type number 23); bf16 is another 2-byte type
                         auto of_type = [&](const py::dtype &d) {
                             return d.itemsize() == 2 && (d.num() == 23) == (emulated == "f16");
                         };
                         bool ok = dense && spec.output.dtype == "f32" && of_type(out);
                         for (size_t i = 0; i < in.size(); ++i)
                             ok = ok && spec.inputs[i].dtype == "f32" && Executor::is_dense(spec.inputs[i]) &&
                                  of_type(in[i]);
                         if (!ok)
                             throw std::invalid_argument("Executor: emulation needs a dense f32 op and 16-bit arrays");
                         if (!call_strides.empty() && call_strides.size() != in.size())
                             throw std::invalid_argument("Executor: one call_strides entry per input expected");
                         for (size_t i = 0; i < call_strides.size(); ++i) {
                             const auto &st = call_strides[i];
                             if (!st.empty() && st.size() != spec.inputs[i].shape.size())
                                 throw std::invalid_argument("Executor: call_strides must have one stride per dim");
                             for (auto x : st)
                                 if (x < 0) throw std::invalid_argument("Executor: call_strides must not be negative");
                         }
                     } else {
                         if (!call_strides.empty())
                             throw std::invalid_argument("Executor: call_strides needs emulated");
                         // the item sizes must be the compiled ones: the pointers go to oneDNN as is
                         for (size_t i = 0; i < in.size(); ++i)
                             if (static_cast<size_t>(in[i].itemsize()) != itemsize_of(spec.inputs[i].dtype))
                                 throw std::invalid_argument("Executor: an input dtype differs from the compiled one");
                         if (static_cast<size_t>(out.itemsize()) != itemsize_of(spec.output.dtype))
                             throw std::invalid_argument("Executor: the output dtype differs from the compiled one");
                     }
                     if (!finite_code.empty() &&
                         (!dense || (finite_code != "bf16" && finite_code != "f16") || out.itemsize() != 2))
                         throw std::invalid_argument("Executor: finite_code needs a dense bf16 or f16 output");
                     Executor e{c, std::move(in), std::move(order), call_size, std::move(unused), std::move(out),
                                dense, std::move(finite_code), std::move(emulated), std::move(call_strides),
                                std::move(call_shapes), std::move(call_out_shape), {}, {}, 0};
                     if (!e.emulated.empty()) e.plan_staging();
                     return e;
                 }),
                 py::arg("compiled"), py::arg("input_dtypes"), py::arg("output_dtype"),
                 py::arg("finite_code") = "", py::arg("order") = std::vector<size_t>{},
                 py::arg("emulated") = "", py::arg("call_size") = 0,
                 py::arg("call_strides") = std::vector<std::vector<int64_t>>{},
                 py::arg("call_shapes") = std::vector<std::vector<int64_t>>{},
                 py::arg("call_out_shape") = std::vector<int64_t>{})
            .def("run", &Executor::run, py::arg("inputs"), py::arg("out"),
                 "Run on arrays matching the plan exactly, else raise SignatureMismatch.")
            .def("run_pointers", &Executor::run_pointers, py::arg("inputs"), py::arg("out"),
                 "Run on raw addresses laid out as compiled (0: None) into a dense output at `out`;\n"
                 "misaligned addresses, or an input given that the plan was made without, raise\n"
                 "SignatureMismatch, as does a guarded result holding an Inf or NaN (after the run).")
            .def_property_readonly("output_shape", [](const Executor &e) { return e.compiled.op->spec().output.shape; })
            .def_property_readonly("dense_output", [](const Executor &e) { return e.dense_output; });
}

}  // namespace onednn_convt
