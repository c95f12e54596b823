// CompiledOp and compile(): Python values turned into an OpSpec, compiled (cached), and run
// on arrays checked against the compiled layout.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bindings.hpp"
#include "gil.hpp"
#include "partition_cache.hpp"

namespace onednn_convt {
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
        // a size-1 dim's stride addresses nothing: the description has its own (plan.describe)
        if (d.shape[i] != 1 && a.strides(i) != d.strides[i] * a.itemsize())
            fail("has strides other than the compiled ones");
    }
    if (reinterpret_cast<uintptr_t>(a.data()) % a.itemsize() != 0) fail("is misaligned");
    if (writable) {
        if (!a.writeable()) fail("is read-only");
        return a.mutable_data();
    }
    return const_cast<void *>(a.data());
}

}  // namespace

std::vector<void *> PyCompiledOp::pointers(const py::sequence &inputs) const {
    const auto &descs = op->spec().inputs;
    if (inputs.size() != descs.size())
        throw std::invalid_argument(op->spec().kind + ": wrong number of inputs");
    std::vector<void *> ptrs;
    for (size_t i = 0; i < descs.size(); ++i)
        ptrs.push_back(checked_pointer(*op, inputs[i].cast<py::array>(), descs[i], "input", false));
    return ptrs;
}

void PyCompiledOp::execute(const py::sequence &inputs, const py::array &output) const {
    auto in = pointers(inputs);
    void *out = checked_pointer(*op, output, op->spec().output, "output", true);
    without_gil([&] { op->execute(in, out); });
}

double PyCompiledOp::time_loop(const py::sequence &inputs, const py::array &output, int64_t iterations) const {
    auto in = pointers(inputs);
    void *out = checked_pointer(*op, output, op->spec().output, "output", true);
    return without_gil([&] {
        auto start = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iterations; ++i) op->execute(in, out);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
}

void register_compiled_op(py::module_ &m) {
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

    m.def(
            "compile",
            [](const std::string &kind, const py::dict &attrs, const py::sequence &inputs,
               const py::handle &output, std::vector<size_t> constant, const py::sequence &nodes,
               std::vector<size_t> stages, int64_t bias_axis) {
                OpSpec spec{kind, to_attrs(attrs), {}, to_desc(output), std::move(constant), {}, std::move(stages),
                            bias_axis};
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
            py::arg("stages") = std::vector<size_t>{}, py::arg("bias_axis") = -1,
            "Compile (or fetch from the cache) one op. Tensors are (shape, strides in elements, dtype code).\n"
            "`constant`: indices of inputs whose values never change between runs; the library\n"
            "reorders them once and caches the result. Such an op is compiled for its caller alone.\n"
            "`nodes`: a graph instead of one op, (kind, attrs, inputs, output) each, in order; an\n"
            "input index >= 0 is the graph's input, -1 - k node k's output. `kind` then names the\n"
            "graph, `attrs` is empty and the last node writes `output`. It must fuse into one partition,\n"
            "or, with `stages` (ascending node indices where a new stage begins), each stage into one:\n"
            "the stages compile apart and run in order, each taking the previous one's result.\n"
            "`bias_axis` >= 0: the last input is an f32 bias, one value per entry of the output's\n"
            "dim `bias_axis`, that the library op does not take: each run adds it to the f32 output\n"
            "after the library op.");
}

}  // namespace onednn_convt
