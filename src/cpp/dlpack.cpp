#include "dlpack.hpp"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace py = pybind11;

namespace onednn_convt {
namespace {

// --- the DLPack ABI -------------------------------------------------------------------
struct DLDevice {
    int32_t device_type;  // 1: CPU
    int32_t device_id;
};
struct DLDataType {
    uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, ...
    uint8_t bits;
    uint16_t lanes;
};
struct DLTensor {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;  // in elements; null means C order
    uint64_t byte_offset;
};
struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(DLManagedTensor *);
};
struct DLPackVersion {
    uint32_t major;
    uint32_t minor;
};
struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(DLManagedTensorVersioned *);
    uint64_t flags;  // bit 0: read only
    DLTensor dl_tensor;
};
constexpr uint64_t kReadOnly = 1;
constexpr int32_t kDLCPU = 1;

// What a consumed capsule leaves to the array that views it: the producer's deleter.
struct Owner {
    void *managed;
    bool versioned;
    ~Owner() {
        if (versioned) {
            auto *m = static_cast<DLManagedTensorVersioned *>(managed);
            if (m->deleter) m->deleter(m);
        } else {
            auto *m = static_cast<DLManagedTensor *>(managed);
            if (m->deleter) m->deleter(m);
        }
    }
};

// What an exported capsule owns: the shape and strides it points to, and the array.
struct Exported {
    DLManagedTensor managed;
    std::vector<int64_t> shape, strides;
    PyObject *array;  // a strong reference
};

void release_exported(DLManagedTensor *m) {
    auto *e = static_cast<Exported *>(m->manager_ctx);
    {
        py::gil_scoped_acquire gil;  // the consumer may free it from any thread
        Py_DECREF(e->array);
    }
    delete e;
}

}  // namespace

py::tuple dlpack_import(const py::capsule &capsule, const py::object &dtype_for) {
    PyObject *cap = capsule.ptr();
    const char *name = PyCapsule_GetName(cap);
    if (name == nullptr) throw py::error_already_set();
    const bool versioned = std::strcmp(name, "dltensor_versioned") == 0;
    if (!versioned && std::strcmp(name, "dltensor") != 0)
        throw std::invalid_argument(std::string("not an unused DLPack capsule (named '") + name + "')");
    void *managed = PyCapsule_GetPointer(cap, name);
    if (managed == nullptr) throw py::error_already_set();
    DLTensor *t;
    bool read_only = false;
    if (versioned) {
        auto *m = static_cast<DLManagedTensorVersioned *>(managed);
        if (m->version.major != 1)
            throw std::invalid_argument("DLPack major version " + std::to_string(m->version.major) +
                                        " is not supported (1 is)");
        t = &m->dl_tensor;
        read_only = (m->flags & kReadOnly) != 0;
    } else {
        t = &static_cast<DLManagedTensor *>(managed)->dl_tensor;
    }
    const int32_t device = t->device.device_type;
    // the dtype first: it may raise, and the capsule must then stay the producer's
    py::dtype dtype = dtype_for(t->dtype.code, t->dtype.bits, t->dtype.lanes).cast<py::dtype>();
    if (device != kDLCPU) return py::make_tuple(py::none(), read_only, device, versioned);
    const auto item = static_cast<py::ssize_t>(dtype.itemsize());
    if (t->ndim < 0) throw std::invalid_argument("DLPack tensor with a negative rank");
    std::vector<py::ssize_t> shape(t->ndim), strides(t->ndim);
    py::ssize_t step = item;
    for (int32_t i = t->ndim; i-- > 0;) {
        shape[i] = static_cast<py::ssize_t>(t->shape[i]);
        strides[i] = t->strides ? static_cast<py::ssize_t>(t->strides[i]) * item : step;
        step *= shape[i];
    }
    char *data = static_cast<char *>(t->data) + t->byte_offset;

    // from here the array owns the tensor: the capsule must not free it too
    if (PyCapsule_SetName(cap, versioned ? "used_dltensor_versioned" : "used_dltensor") != 0)
        throw py::error_already_set();
    py::capsule base(new Owner{managed, versioned}, [](void *p) { delete static_cast<Owner *>(p); });
    py::array array(dtype, shape, strides, data, base);
    return py::make_tuple(array, read_only, device, versioned);
}

py::capsule dlpack_export(const py::array &array, int code, int bits) {
    const auto item = array.itemsize();
    if (bits != item * 8) throw std::invalid_argument("dlpack_export: bits differ from the item size");
    auto *e = new Exported{};
    const auto nd = array.ndim();
    for (py::ssize_t i = 0; i < nd; ++i) {
        if (array.strides(i) % item != 0) {
            delete e;
            throw std::invalid_argument("dlpack_export: strides must be whole elements");
        }
        e->shape.push_back(array.shape(i));
        e->strides.push_back(array.strides(i) / item);
    }
    e->array = array.ptr();
    Py_INCREF(e->array);
    DLTensor &t = e->managed.dl_tensor;
    t.data = const_cast<void *>(array.data());
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(nd);
    t.dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
    t.shape = e->shape.data();
    t.strides = e->strides.data();
    t.byte_offset = 0;
    e->managed.manager_ctx = e;
    e->managed.deleter = release_exported;
    PyObject *cap = PyCapsule_New(&e->managed, "dltensor", [](PyObject *c) {
        // a capsule nobody consumed still owns its tensor
        if (PyCapsule_IsValid(c, "dltensor")) {
            auto *m = static_cast<DLManagedTensor *>(PyCapsule_GetPointer(c, "dltensor"));
            m->deleter(m);
        }
    });
    if (cap == nullptr) {
        Py_DECREF(e->array);
        delete e;
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::capsule>(cap);
}

}  // namespace onednn_convt
