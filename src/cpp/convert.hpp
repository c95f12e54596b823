// f32 <-> bf16 / f16 conversion of C-contiguous arrays with AVX2 and F16C.
//
// Emulated low-precision ops (spec D10) convert every input and the result; NumPy converts
// f16 at about 2 ns an element and oneDNN 3.2's reorder at about 30 ns here, so this is
// the one hand-written loop in the core. Rounding is to nearest even, as NumPy and
// ml_dtypes do.
#pragma once

#include <pybind11/numpy.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace onednn_convt {

enum class LowType { bf16, f16 };

// Whether this CPU has the AVX2 and F16C instructions the converters below need.
bool fast_conversion();

// n elements between a 16-bit float type and f32, rounding to nearest even towards the
// 16-bit type. Large n runs on the OpenMP threads. Needs fast_conversion(); no GIL.
void low_to_f32(const uint16_t *in, float *out, size_t n, LowType low);
void f32_to_low(const float *in, uint16_t *out, size_t n, LowType low);

// The elements of a 16-bit array of `shape` and `strides` (in elements, none negative)
// into dense (C-order) f32 at out, read in the array's memory order (its largest stride
// first): a channels-last array costs what a dense one does. Large arrays run on the
// OpenMP threads. Needs fast_conversion(); no GIL.
void low_to_f32_strided(const uint16_t *in, const std::vector<int64_t> &shape, const std::vector<int64_t> &strides,
                        float *out, LowType low);

// Converts src into dst (same element count, both C-contiguous). Returns false, touching
// nothing, when the CPU lacks AVX2/F16C. Throws std::invalid_argument on bad arguments.
bool convert(const pybind11::array &src, const std::string &src_code, pybind11::array &dst,
             const std::string &dst_code);

// Whether n bf16 or f16 values hold no Inf and no NaN (an exponent of all ones).
bool all_finite_16(const uint16_t *data, size_t n, const std::string &code);

// The same for a C-contiguous bf16 or f16 array; throws std::invalid_argument otherwise.
bool all_finite(const pybind11::array &a, const std::string &code);

}  // namespace onednn_convt
