// The module's utilities: conversions, staging memory, caches, version, DLPack, the ISA.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <initializer_list>
#include <string>
#include <utility>

#include "oneapi/dnnl/dnnl.hpp"

#include "bindings.hpp"
#include "convert.hpp"
#include "dlpack.hpp"
#include "host_memory.hpp"
#include "partition_cache.hpp"
#include "staging.hpp"

namespace onednn_convt {

namespace {
py::dict counters(std::initializer_list<std::pair<const char *, size_t>> items) {
    py::dict d;
    for (const auto &[name, value] : items) d[name] = value;
    return d;
}
}  // namespace

void register_utilities(py::module_ &m) {
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
          "Give back the calling thread's f32 staging memory (a block of 1 MiB or more to the kept ones, which release_host_memory frees).");

    m.def("all_finite", &all_finite, py::arg("array"), py::arg("code"),
          "Whether an aligned C-contiguous bf16 (code 'bf16') or f16 array holds no Inf or NaN.");

    m.def("cache_info", [] {
        auto i = global_cache().info();
        return counters({{"hits", i.hits}, {"misses", i.misses}, {"size", i.size}, {"capacity", i.capacity}});
    });
    m.def("host_memory_info", [] {
        auto i = host_memory_info();
        return counters({{"kept_bytes", i.kept_bytes}, {"kept_blocks", i.kept_blocks},
                         {"reused", i.reused}, {"allocated", i.allocated}});
    }, "The library's large temporary blocks: bytes and blocks kept for reuse, requests reused and newly allocated.");
    m.def("host_empty", [](const py::object &dtype, const std::vector<py::ssize_t> &shape) {
        return host_array(py::dtype::from_args(dtype), shape);
    }, py::arg("dtype"), py::arg("shape"),
          "A new C-ordered array, from the kept blocks when it takes 1 MiB or more (see host_memory_info).");
    m.attr("host_kept_from") = kKeptFrom;
    m.attr("host_kept_bytes") = kKeptBytes;
    m.def("release_host_memory", &release_host_memory, "Free the large temporary blocks kept for reuse.");
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

}  // namespace onednn_convt
