// Library failures (dnnl::error) as the package's exceptions: OneDNNError, or
// UnsupportedError for dnnl_unimplemented, carrying oneDNN's status. The Python layer gives
// the types once (set_error_types, from onednn_convt.native); nothing is imported at raise
// time.
#include <pybind11/pybind11.h>

#include <string>

#include "oneapi/dnnl/dnnl.hpp"

#include "bindings.hpp"

namespace onednn_convt {
namespace {

// Kept for the process's life (never destroyed: a Python object must not be released
// after the interpreter finalizes).
py::object *onednn_error_type = nullptr;
py::object *unsupported_error_type = nullptr;

void translate_dnnl_error(const dnnl::error &e) {
    py::object *type = e.status == dnnl_unimplemented ? unsupported_error_type : onednn_error_type;
    if (type == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return;
    }
    py::object exc = (*type)(std::string(e.what()), static_cast<int>(e.status));
    PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
}

}  // namespace

void register_errors(py::module_ &m) {
    m.def(
            "set_error_types",
            [](py::object onednn_error, py::object unsupported_error) {
                delete onednn_error_type;
                delete unsupported_error_type;
                onednn_error_type = new py::object(std::move(onednn_error));
                unsupported_error_type = new py::object(std::move(unsupported_error));
            },
            py::arg("onednn_error"), py::arg("unsupported_error"),
            "The exception types raised for oneDNN failures (called with status, message).");
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const dnnl::error &e) {
            translate_dnnl_error(e);
        } catch (const ExecutionOutOfMemory &e) {
            PyErr_SetString(PyExc_MemoryError, e.what());
        } catch (const HostAllocationFailed &e) {
            const std::string what = "could not allocate " + std::to_string(e.bytes) +
                                     " bytes (out of memory, or at the process's address-space limit, ulimit -v)";
            PyErr_SetString(PyExc_MemoryError, what.c_str());
        }
    });
}

}  // namespace onednn_convt
