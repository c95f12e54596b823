// DLPack in and out: share memory with torch, JAX and any other producer of DLPack
// capsules, bfloat16 included (NumPy's own from_dlpack refuses it).
//
// The structs follow the DLPack ABI (dlpack.h, v0.8 "dltensor" capsules and v1.x
// "dltensor_versioned" ones). Which dtypes are accepted, and what a device means for the
// user, is decided in Python (onednn_convt/interop.py); this side only moves pointers.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace onednn_convt {

// Takes ownership of the tensor in a DLPack capsule (renaming it "used_...", as the
// protocol asks) and returns (array, read_only, device_type, versioned); a legacy capsule
// (versioned false) cannot say whether its memory may be written. `dtype_for(code, bits, lanes)`
// gives the NumPy dtype of the tensor's elements or raises. The array keeps the producer's
// memory alive and calls its deleter when the array is freed.
pybind11::tuple dlpack_import(const pybind11::capsule &capsule, const pybind11::object &dtype_for);

// A legacy "dltensor" capsule viewing `array` (kept alive until the consumer's deleter
// runs), with the DLPack type (code, bits) given by the caller. CPU memory, lanes 1.
pybind11::capsule dlpack_export(const pybind11::array &array, int code, int bits);

}  // namespace onednn_convt
