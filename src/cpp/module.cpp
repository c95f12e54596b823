// Python bindings: turn Python values into OpSpec / raw pointers, release the GIL, call.
// Spellings, defaults, shapes and messages for users live in the Python package.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "oneapi/dnnl/dnnl.hpp"

#include "compiled_op.hpp"
#include "convert.hpp"
#include "dlpack.hpp"
#include "gil.hpp"
#include "partition_cache.hpp"
#include "staging.hpp"

namespace py = pybind11;
using namespace onednn_convt;

namespace {

TensorDesc to_desc(const py::handle &obj) {
    auto t = obj.cast<py::tuple>();
    if (t.size() != 3) throw std::invalid_argument("tensor description must be (shape, strides, dtype)");
    return {t[0].cast<Dims>(), t[1].cast<Dims>(), t[2].cast<std::string>()};
}

Attrs to_attrs(const py::dict &d) {
    Attrs attrs;
    for (auto item : d) {
        auto name = item.first.cast<std::string>();
        py::handle v = item.second;
        if (py::isinstance<py::str>(v)) attrs[name] = v.cast<std::string>();
        else if (py::isinstance<py::bool_>(v)) throw std::invalid_argument("attribute " + name + ": a bool");
        else if (py::isinstance<py::int_>(v)) attrs[name] = v.cast<int64_t>();
        else if (py::isinstance<py::float_>(v)) attrs[name] = v.cast<double>();
        else {
            // a list: of floats (an f32 attribute such as scales) if its first item is one
            auto seq = v.cast<py::sequence>();
            if (seq.size() > 0 && py::isinstance<py::float_>(seq[0])) attrs[name] = v.cast<Floats>();
            else attrs[name] = v.cast<Dims>();
        }
    }
    return attrs;
}

size_t itemsize_of(const std::string &dtype) {
    if (dtype == "u8" || dtype == "s8") return 1;
    return (dtype == "bf16" || dtype == "f16") ? 2 : 4;
}

// (kind, attrs, inputs, output): `inputs` index the graph's inputs (>= 0) or earlier nodes'
// outputs (-1 - k for node k); `output` is the node's tensor description.
NodeSpec to_node(const py::handle &obj) {
    auto t = obj.cast<py::tuple>();
    if (t.size() != 4) throw std::invalid_argument("node description must be (kind, attrs, inputs, output)");
    return {t[0].cast<std::string>(), to_attrs(t[1].cast<py::dict>()), t[2].cast<std::vector<int64_t>>(),
            to_desc(t[3])};
}

// Checks an array against the description it was compiled for and returns its pointer.
void *checked_pointer(const CompiledOp &op, py::array a, const TensorDesc &d,
                      const char *role, bool writable) {
    const std::string &k = op.spec().kind;
    auto fail = [&](const std::string &what) {
        throw std::invalid_argument(k + ": " + role + " " + what);
    };
    if (static_cast<size_t>(a.itemsize()) != itemsize_of(d.dtype)) fail("has the wrong item size");
    if (static_cast<size_t>(a.ndim()) != d.shape.size()) fail("has the wrong rank");
    for (size_t i = 0; i < d.shape.size(); ++i) {
        if (a.shape(i) != d.shape[i]) fail("has a shape other than the compiled one");
        if (a.strides(i) != d.strides[i] * a.itemsize())
            fail("has strides other than the compiled ones");
    }
    if (reinterpret_cast<uintptr_t>(a.data()) % a.itemsize() != 0) fail("is misaligned");
    if (writable) {
        if (!a.writeable()) fail("is read-only");
        return a.mutable_data();
    }
    return const_cast<void *>(a.data());
}

struct PyCompiledOp {
    std::shared_ptr<const CompiledOp> op;

    std::vector<void *> pointers(const py::sequence &inputs) const {
        const auto &descs = op->spec().inputs;
        if (inputs.size() != descs.size())
            throw std::invalid_argument(op->spec().kind + ": wrong number of inputs");
        std::vector<void *> ptrs;
        for (size_t i = 0; i < descs.size(); ++i)
            ptrs.push_back(checked_pointer(*op, inputs[i].cast<py::array>(), descs[i], "input", false));
        return ptrs;
    }

    void execute(const py::sequence &inputs, const py::array &output) const {
        auto in = pointers(inputs);
        void *out = checked_pointer(*op, output, op->spec().output, "output", true);
        without_gil([&] { op->execute(in, out); });
    }

    double time_loop(const py::sequence &inputs, const py::array &output, int64_t iterations) const {
        auto in = pointers(inputs);
        void *out = checked_pointer(*op, output, op->spec().output, "output", true);
        return without_gil([&] {
            auto start = std::chrono::steady_clock::now();
            for (int64_t i = 0; i < iterations; ++i) op->execute(in, out);
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        });
    }
};

// Raised by Executor when the arrays are not the ones it was made for; the Python layer
// then takes its full path (checks, planning, messages). Never seen by users.
struct SignatureMismatch : std::exception {
    const char *what() const noexcept override { return "arrays differ from the plan"; }
};

// The per-call fast path of one op object: a compiled op plus the NumPy dtypes it was
// planned for. It runs only arrays that match the plan exactly (dtype, shape, strides,
// alignment, no overlap between out and the inputs) and allocates the output itself.
// `order` maps the library's inputs to the call's (a lowering may swap them); a call input
// in no order entry (a fused call's missing bias) must be None.
// With finite_code set ("bf16"/"f16"), a result holding an Inf or NaN also raises
// SignatureMismatch after the run, so that the Python layer redoes the call its own way
// (oneDNN 3.2's native low-precision kernels spread non-finite values; see ops.py).
// With emulated set ("bf16"/"f16"), the compiled op is the f32 one of an emulated plan
// (dense inputs and output): the call's dense bf16/f16 arrays are converted into the
// thread's staging memory, run in f32 and the result rounded into the output.
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

    static bool is_dense(const TensorDesc &d) {
        int64_t step = 1;
        for (size_t i = d.shape.size(); i-- > 0;) {
            if (d.shape[i] != 1 && d.strides[i] != step) return false;
            step *= d.shape[i];
        }
        return true;
    }

    static bool matches(const py::handle &h, const py::dtype &dtype, const TensorDesc &d) {
        if (!py::isinstance<py::array>(h)) return false;
        auto a = py::reinterpret_borrow<py::array>(h);
        if (static_cast<size_t>(a.ndim()) != d.shape.size() || !a.dtype().equal(dtype)) return false;
        const auto item = a.itemsize();
        for (size_t i = 0; i < d.shape.size(); ++i)
            if (a.shape(i) != d.shape[i] || a.strides(i) != d.strides[i] * item) return false;
        return reinterpret_cast<uintptr_t>(a.data()) % item == 0;
    }

    static std::pair<uintptr_t, uintptr_t> extent(const py::array &a) {
        auto lo = reinterpret_cast<uintptr_t>(a.data()), hi = lo + a.itemsize();
        for (py::ssize_t i = 0; i < a.ndim(); ++i) hi += (a.shape(i) - 1) * a.strides(i);
        return {lo, hi};  // strides are positive here (checked at planning)
    }

    py::array run(const py::tuple &inputs, const py::object &out) const {
        const auto &spec = compiled.op->spec();
        if (inputs.size() != call_size) throw SignatureMismatch();
        for (size_t i : unused)  // an input this plan was made without (a bias, say)
            if (!inputs[i].is_none()) throw SignatureMismatch();
        std::vector<void *> ptrs(order.size());
        for (size_t i = 0; i < order.size(); ++i) {
            const auto h = inputs[order[i]];
            if (!matches(h, input_dtypes[i], spec.inputs[i])) throw SignatureMismatch();
            ptrs[i] = const_cast<void *>(py::reinterpret_borrow<py::array>(h).data());
        }
        py::array result;
        if (out.is_none()) {
            if (!dense_output) throw SignatureMismatch();
            result = py::array(output_dtype, spec.output.shape);
        } else {
            if (!matches(out, output_dtype, spec.output)) throw SignatureMismatch();
            result = py::reinterpret_borrow<py::array>(out);
            if (!result.writeable()) throw SignatureMismatch();
            auto [lo, hi] = extent(result);
            for (size_t i : order) {
                auto [a, b] = extent(py::reinterpret_borrow<py::array>(inputs[i]));
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
        const auto &sizes = staged_sizes, &offsets = staged_offsets;
        without_gil([&] {
            Staging &staging = Staging::local();
            float *base = staging.get(staged_total);
            std::vector<void *> f32(ptrs.size());
            for (size_t i = 0; i < ptrs.size(); ++i) {
                f32[i] = base + offsets[i];
                low_to_f32(static_cast<const uint16_t *>(ptrs[i]), base + offsets[i], sizes[i], type);
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

void translate_dnnl_error(const dnnl::error &e) {
    auto errors = py::module_::import("onednn_convt.errors");
    const char *cls = e.status == dnnl_unimplemented ? "UnsupportedError" : "OneDNNError";
    py::object exc = errors.attr(cls)(std::string(e.what()), static_cast<int>(e.status));
    PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "Native core of onednn_convt: compile (cached) and execute oneDNN Graph ops.";

    // oneDNN's own compiled-partition cache never hits for us (its key includes the
    // partition's id, and every compile builds a new graph; measured: with it at 1024, a
    // recompile of a spec created every primitive again, from oneDNN's primitive cache,
    // which stays on). But it keeps up to 1024 compiled partitions alive after we drop
    // them, with whatever they hold: for an op with constant weights, the reordered
    // weights (measured: 8 MB kept per dropped dcgan1 op). Off, a dropped op frees it.
    dnnl::graph::set_compiled_partition_cache_capacity(0);

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const dnnl::error &e) {
            translate_dnnl_error(e);
        }
    });

    py::class_<PyCompiledOp>(m, "CompiledOp")
            .def_property_readonly("kind", [](const PyCompiledOp &c) { return c.op->spec().kind; })
            .def_property_readonly("key", [](const PyCompiledOp &c) { return c.op->spec().key(); })
            .def_property_readonly("constant_inputs",
                                   [](const PyCompiledOp &c) { return c.op->spec().constant_inputs; })
            .def_property_readonly("inplace_inputs",
                                   [](const PyCompiledOp &c) { return c.op->inplace_inputs(); })
            .def_property_readonly("partitions", [](const PyCompiledOp &c) { return c.op->stages(); })
            .def("execute", &PyCompiledOp::execute, py::arg("inputs"), py::arg("output"),
                 "Run once on arrays laid out exactly as compiled; the GIL is released.")
            .def("time_loop", &PyCompiledOp::time_loop, py::arg("inputs"), py::arg("output"),
                 py::arg("iterations"),
                 "Run `iterations` times in a C++ loop; returns the total seconds.");

    py::register_exception<SignatureMismatch>(m, "SignatureMismatch");
    py::class_<Executor>(m, "Executor")
            .def(py::init([](const PyCompiledOp &c, std::vector<py::dtype> in, py::dtype out,
                             std::string finite_code, std::vector<size_t> order, std::string emulated,
                             size_t call_size) {
                     const auto &spec = c.op->spec();
                     if (in.size() != spec.inputs.size())
                         throw std::invalid_argument("Executor: one dtype per input expected");
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
                     } else {
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
                                dense, std::move(finite_code), std::move(emulated), {}, {}, 0};
                     if (!e.emulated.empty()) e.plan_staging();
                     return e;
                 }),
                 py::arg("compiled"), py::arg("input_dtypes"), py::arg("output_dtype"),
                 py::arg("finite_code") = "", py::arg("order") = std::vector<size_t>{},
                 py::arg("emulated") = "", py::arg("call_size") = 0)
            .def("run", &Executor::run, py::arg("inputs"), py::arg("out"),
                 "Run on arrays matching the plan exactly, else raise SignatureMismatch.")
            .def("run_pointers", &Executor::run_pointers, py::arg("inputs"), py::arg("out"),
                 "Run on raw addresses laid out as compiled (0: None) into a dense output at `out`;\n"
                 "misaligned addresses, or an input given that the plan was made without, raise\n"
                 "SignatureMismatch, as does a guarded result holding an Inf or NaN (after the run).")
            .def_property_readonly("output_shape", [](const Executor &e) { return e.compiled.op->spec().output.shape; })
            .def_property_readonly("dense_output", [](const Executor &e) { return e.dense_output; });

    m.def(
            "compile",
            [](const std::string &kind, const py::dict &attrs, const py::sequence &inputs,
               const py::handle &output, std::vector<size_t> constant, const py::sequence &nodes,
               std::vector<size_t> stages) {
                OpSpec spec{kind, to_attrs(attrs), {}, to_desc(output), std::move(constant), {}, std::move(stages)};
                for (auto t : inputs) spec.inputs.push_back(to_desc(t));
                for (auto n : nodes) spec.nodes.push_back(to_node(n));
                return without_gil([&] {
                    if (!spec.constant_inputs.empty())  // one set of values: never shared
                        return PyCompiledOp{std::make_shared<const CompiledOp>(std::move(spec))};
                    return PyCompiledOp{global_cache().get(std::move(spec))};
                });
            },
            py::arg("kind"), py::arg("attrs"), py::arg("inputs"), py::arg("output"),
            py::arg("constant") = std::vector<size_t>{}, py::arg("nodes") = py::tuple(),
            py::arg("stages") = std::vector<size_t>{},
            "Compile (or fetch from the cache) one op. Tensors are (shape, strides in elements, dtype code).\n"
            "`constant`: indices of inputs whose values never change between runs; the library\n"
            "reorders them once and caches the result. Such an op is compiled for its caller alone.\n"
            "`nodes`: a graph instead of one op, (kind, attrs, inputs, output) each, in order; an\n"
            "input index >= 0 is the graph's input, -1 - k node k's output. `kind` then names the\n"
            "graph, `attrs` is empty and the last node writes `output`. It must fuse into one partition,\n"
            "or, with `stages` (ascending node indices where a new stage begins), each stage into one:\n"
            "the stages compile apart and run in order, each taking the previous one's result.");

    m.def(
            "convert",
            [](const py::array &src, const std::string &src_code, py::array dst,
               const std::string &dst_code) {
                return convert(src, src_code, dst, dst_code);
            },
            py::arg("src"), py::arg("src_code"), py::arg("dst"), py::arg("dst_code"),
            "Convert C-contiguous src into dst (same size) between f32 and bf16/f16, rounding\n"
            "to nearest even. Returns False (and does nothing) where this CPU lacks F16C/AVX2.");

    m.attr("fast_conversion") = fast_conversion();
    m.def("staging_bytes", [] { return Staging::local().capacity(); },
          "Bytes of f32 staging memory the calling thread keeps for emulated calls.");
    m.def("clear_staging", [] { Staging::local().clear(); },
          "Free the calling thread's f32 staging memory.");

    m.def("all_finite", &all_finite, py::arg("array"), py::arg("code"),
          "Whether an aligned C-contiguous bf16 (code 'bf16') or f16 array holds no Inf or NaN.");

    m.def("cache_info", [] {
        auto i = global_cache().info();
        py::dict d;
        d["hits"] = i.hits;
        d["misses"] = i.misses;
        d["size"] = i.size;
        d["capacity"] = i.capacity;
        return d;
    });
    m.def("set_cache_capacity", [](size_t n) { global_cache().set_capacity(n); }, py::arg("capacity"));
    m.def("clear_cache", [] { global_cache().clear(); });

    m.def("version", [] {
        const dnnl_version_t *v = dnnl::version();
        py::dict d;
        d["major"] = v->major;
        d["minor"] = v->minor;
        d["patch"] = v->patch;
        d["hash"] = std::string(v->hash);
        d["cpu_runtime"] = v->cpu_runtime;
        return d;
    });
    m.def("dlpack_import", &dlpack_import, py::arg("capsule"), py::arg("dtype_for"),
          "Consume a DLPack capsule: (array viewing its memory or None off the CPU, read_only,\n"
          "device_type, versioned). dtype_for(code, bits, lanes) returns the NumPy dtype or raises.");
    m.def("dlpack_export", &dlpack_export, py::arg("array"), py::arg("code"), py::arg("bits"),
          "A 'dltensor' capsule viewing `array` (kept alive by it), of DLPack type (code, bits).");
    m.def("cpu_isa", [] { return static_cast<int>(dnnl::get_effective_cpu_isa()); });
    m.def("library_entered", &library_entered,
          "Whether any thread of this process (or of the parent it was forked from) has compiled or run\n"
          "an op: the OpenMP thread pools a forked child cannot use may exist.");
}
