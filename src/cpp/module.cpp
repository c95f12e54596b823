// The native module: registers each concern (bindings.hpp). Spellings, defaults, shapes and
// messages for users live in the Python package.
#include <pybind11/pybind11.h>

#include "oneapi/dnnl/dnnl_graph.hpp"

#include "bindings.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
    m.doc() = "Native core of onednn_convt: compile (cached) and execute oneDNN Graph ops.";

    // oneDNN's own compiled-partition cache never hits for us (its key includes the
    // partition's id, and every compile builds a new graph; measured: with it at 1024, a
    // recompile of a spec created every primitive again, from oneDNN's primitive cache,
    // which stays on). But it keeps up to 1024 compiled partitions alive after we drop
    // them, with whatever they hold: for an op with constant weights, the reordered
    // weights (measured: 8 MB kept per dropped dcgan1 op). Off, a dropped op frees it.
    dnnl::graph::set_compiled_partition_cache_capacity(0);

    onednn_convt::register_errors(m);
    onednn_convt::register_compiled_op(m);
    onednn_convt::register_executor(m);
    onednn_convt::register_phased_executor(m);
    onednn_convt::register_utilities(m);
}
