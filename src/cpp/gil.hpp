// Running native work with the GIL released.
#pragma once

#include <Python.h>

#include <csignal>
#include <optional>
#include <type_traits>
#include <unistd.h>

namespace onednn_convt {

// Runs `work` with the GIL released and takes the GIL back in plain code, never in a
// destructor (as pybind11's gil_scoped_release would). A daemon thread that takes the GIL
// while the interpreter finalizes is ended by CPython (3.9-3.13) with pthread_exit, whose
// forced unwinding through a destructor (noexcept) calls std::terminate: the process
// aborted at exit ("terminate called without an active exception") when a daemon thread
// was inside an op. A thread that finishes its work during finalization is parked instead
// (the process ends it at exit, as Python 3.14 does with daemon threads).
template <typename Work>
auto without_gil(Work &&work) -> decltype(work()) {
    PyThreadState *state = PyEval_SaveThread();
    auto park_if_finalizing = [] {
#if PY_VERSION_HEX >= 0x030D0000
        const bool finalizing = Py_IsFinalizing();
#else
        const bool finalizing = _Py_IsFinalizing();
#endif
        if (finalizing)
            for (;;) pause();
    };
    // the GIL is taken back outside the try blocks: its forced unwinding passes no catch
    if constexpr (std::is_void_v<decltype(work())>) {
        try {
            work();
        } catch (...) {
            park_if_finalizing();
            PyEval_RestoreThread(state);
            throw;
        }
        park_if_finalizing();
        PyEval_RestoreThread(state);
    } else {
        std::optional<decltype(work())> result;
        try {
            result.emplace(work());
        } catch (...) {
            park_if_finalizing();
            PyEval_RestoreThread(state);
            throw;
        }
        park_if_finalizing();
        PyEval_RestoreThread(state);
        return std::move(*result);
    }
}

}  // namespace onednn_convt
