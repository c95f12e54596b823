// What the binding's files share: the Python-facing compiled op, and the registration of
// each concern on the module (module.cpp calls them in order).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compiled_op.hpp"
#include "host_memory.hpp"

namespace onednn_convt {

namespace py = pybind11;

// Bytes per element of a dtype code ("f32", "bf16", "f16", "u8", "s8", "s32").
inline size_t itemsize_of(const std::string &dtype) {
    if (dtype == "u8" || dtype == "s8") return 1;
    return (dtype == "bf16" || dtype == "f16") ? 2 : 4;
}

// A new C-ordered array: from host_memory's kept blocks from kKeptFrom bytes (returned there
// when NumPy frees it), so that a large result or intermediate takes memory that is already
// mapped rather than fresh pages; smaller ones from NumPy.
inline py::array host_array(const py::dtype &dtype, const std::vector<py::ssize_t> &shape) {
    size_t bytes = static_cast<size_t>(dtype.itemsize());
    for (py::ssize_t n : shape) bytes *= static_cast<size_t>(n);
    if (bytes < kKeptFrom) return py::array(dtype, shape);
    void *block = host_allocate(bytes, 64);
    py::capsule owner(block, [](void *p) { host_deallocate(p); });
    return py::array(dtype, shape, block, owner);
}

// The addresses from an array's first element to one past its last (strides not negative).
inline std::pair<uintptr_t, uintptr_t> address_range(const py::array &a) {
    auto lo = reinterpret_cast<uintptr_t>(a.data()), hi = lo + a.itemsize();
    for (py::ssize_t i = 0; i < a.ndim(); ++i) hi += (a.shape(i) - 1) * a.strides(i);
    return {lo, hi};
}

// Whether `strides` (in units of which one element is `item`) are C order for `shape`, a
// size-1 dim's stride aside (it addresses nothing).
inline bool is_c_dense(const std::vector<int64_t> &shape, const std::vector<int64_t> &strides, int64_t item) {
    int64_t step = item;
    for (size_t i = shape.size(); i-- > 0;) {
        if (shape[i] != 1 && strides[i] != step) return false;
        step *= shape[i];
    }
    return true;
}

// A compiled op as Python holds it: runs on arrays checked against its compiled layout.
struct PyCompiledOp {
    std::shared_ptr<const CompiledOp> op;

    std::vector<void *> pointers(const py::sequence &inputs) const;
    void execute(const py::sequence &inputs, const py::array &output) const;
    double time_loop(const py::sequence &inputs, const py::array &output, int64_t iterations) const;
};

// Raised by the executors when the arrays are not the ones they were made for; the Python
// layer then takes its full path (checks, planning, messages). Never seen by users.
struct SignatureMismatch : std::exception {
    const char *what() const noexcept override { return "arrays differ from the plan"; }
};

// The package's exception types for library failures, given by the Python layer
// (onednn_convt.native) and raised for dnnl::error; until then a RuntimeError.
void register_errors(py::module_ &m);
// CompiledOp and compile().
void register_compiled_op(py::module_ &m);
// Executor and SignatureMismatch: the per-call fast path.
void register_executor(py::module_ &m);
// PhasedExecutor: the per-call fast path of a call made of several library ops.
void register_phased_executor(py::module_ &m);
// Conversions, staging memory, caches, version, DLPack, the dispatch ISA.
void register_utilities(py::module_ &m);

}  // namespace onednn_convt
