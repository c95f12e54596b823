#include "convert.hpp"
#include "gil.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace py = pybind11;

namespace onednn_convt {

namespace {

#define AVX2_F16C __attribute__((target("avx2,f16c")))

AVX2_F16C void f16_to_f32(const uint16_t *in, float *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i))));
    for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

AVX2_F16C void f32_to_f16(const float *in, uint16_t *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT);
}

AVX2_F16C float f16_value(uint16_t h) { return _cvtsh_ss(h); }

float bf16_value(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

void bf16_to_f32(const uint16_t *in, float *out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
        std::memcpy(out + i, &bits, 4);
    }
}

uint16_t round_to_bf16(uint32_t bits) {
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
    return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

AVX2_F16C void f32_to_bf16(const float *in, uint16_t *out, size_t n) {
    size_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x400000);
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_castps_si256(_mm256_loadu_ps(in + i));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
        __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(bias, lsb));
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
        __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(x, quiet), nan);
        r = _mm256_srli_epi32(r, 16);
        __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i), packed);
    }
    for (; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, in + i, 4);
        out[i] = round_to_bf16(bits);
    }
}

// Element counts below this run on the calling thread: a parallel region costs a few
// microseconds, about what one thread needs to convert this many.
constexpr size_t kParallelFrom = size_t{1} << 16;
constexpr size_t kChunk = size_t{1} << 14;  // elements per parallel task (a multiple of 8)

// Runs fn(begin, end) over [0, n) in chunks, on the OpenMP threads oneDNN uses too.
template <typename Fn>
void for_chunks(size_t n, Fn fn) {
#ifdef _OPENMP
    if (n >= kParallelFrom) {
        const auto chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < chunks; ++c) {
            const size_t begin = static_cast<size_t>(c) * kChunk;
            fn(begin, std::min(n, begin + kChunk));
        }
        return;
    }
#endif
    fn(size_t{0}, n);
}

bool c_contiguous(const py::array &a) {
    return (a.flags() & py::array::c_style) != 0;
}

}  // namespace

bool fast_conversion() {
    static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return supported;
}

void low_to_f32(const uint16_t *in, float *out, size_t n, LowType low) {
    auto convert = low == LowType::f16 ? f16_to_f32 : bf16_to_f32;
    for_chunks(n, [&](size_t b, size_t e) { convert(in + b, out + b, e - b); });
}

void f32_to_low(const float *in, uint16_t *out, size_t n, LowType low) {
    auto convert = low == LowType::f16 ? f32_to_f16 : f32_to_bf16;
    for_chunks(n, [&](size_t b, size_t e) { convert(in + b, out + b, e - b); });
}

void low_to_f32_strided(const uint16_t *in, const std::vector<int64_t> &shape, const std::vector<int64_t> &strides,
                        float *out, LowType low) {
    const size_t nd = shape.size();
    std::vector<int64_t> dense(nd);
    int64_t n = 1;
    for (size_t i = nd; i-- > 0;) {
        dense[i] = n;
        n *= shape[i];
    }
    if (n == 0) return;
    auto convert = low == LowType::f16 ? f16_to_f32 : bf16_to_f32;
    auto value = low == LowType::f16 ? f16_value : bf16_value;
    // the dims of more than one element in the array's memory order, the innermost last
    std::vector<size_t> dims;
    for (size_t i = 0; i < nd; ++i)
        if (shape[i] > 1) dims.push_back(i);
    if (dims.empty()) {
        *out = value(*in);
        return;
    }
    std::stable_sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
    const size_t inner = dims.back();
    dims.pop_back();
    const int64_t len = shape[inner], step_in = strides[inner], step_out = dense[inner];
    const int64_t rows = n / len;
    // one row of the innermost dim: contiguous in memory, read by the vector converter
    auto row = [&](int64_t r, float *scratch) {
        int64_t from = 0, to = 0;
        for (size_t k = dims.size(); k-- > 0;) {
            const size_t d = dims[k];
            const int64_t i = r % shape[d];
            r /= shape[d];
            from += i * strides[d];
            to += i * dense[d];
        }
        const uint16_t *src = in + from;
        float *dst = out + to;
        if (step_in == 1 && step_out == 1) {
            convert(src, dst, static_cast<size_t>(len));
        } else if (step_in == 1) {
            convert(src, scratch, static_cast<size_t>(len));
            for (int64_t j = 0; j < len; ++j) dst[j * step_out] = scratch[j];
        } else {
            for (int64_t j = 0; j < len; ++j) dst[j * step_out] = value(src[j * step_in]);
        }
    };
#ifdef _OPENMP
    if (static_cast<size_t>(n) >= kParallelFrom && rows > 1) {
#pragma omp parallel
        {
            std::vector<float> scratch(static_cast<size_t>(len));
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; ++r) row(r, scratch.data());
        }
        return;
    }
#endif
    std::vector<float> scratch(static_cast<size_t>(len));
    for (int64_t r = 0; r < rows; ++r) row(r, scratch.data());
}

bool convert(const py::array &src, const std::string &src_code, py::array &dst,
             const std::string &dst_code) {
    if (src.size() != dst.size() || !c_contiguous(src) || !c_contiguous(dst))
        throw std::invalid_argument("convert: C-contiguous arrays of one size expected");
    if (!dst.writeable()) throw std::invalid_argument("convert: destination is read-only");
    if (reinterpret_cast<uintptr_t>(src.data()) % src.itemsize() != 0 ||
        reinterpret_cast<uintptr_t>(dst.data()) % dst.itemsize() != 0)
        throw std::invalid_argument("convert: aligned arrays expected");
    const bool to_f32 = dst_code == "f32";
    const std::string &low = to_f32 ? src_code : dst_code;
    if (!to_f32 && src_code != "f32") throw std::invalid_argument("convert: one side must be f32");
    if ((low != "f16" && low != "bf16") || src.itemsize() != (to_f32 ? 2 : 4) ||
        dst.itemsize() != (to_f32 ? 4 : 2))
        throw std::invalid_argument("convert: expected f32 <-> bf16 or f16 with matching item sizes");
    if (!fast_conversion()) return false;
    const size_t n = static_cast<size_t>(src.size());
    const void *in = src.data();
    void *out = dst.mutable_data();
    const LowType type = low == "f16" ? LowType::f16 : LowType::bf16;
    without_gil([&] {
        if (to_f32) low_to_f32(static_cast<const uint16_t *>(in), static_cast<float *>(out), n, type);
        else f32_to_low(static_cast<const float *>(in), static_cast<uint16_t *>(out), n, type);
    });
    return true;
}

bool all_finite_16(const uint16_t *data, size_t n, const std::string &code) {
    const uint16_t exponent = code == "bf16" ? 0x7f80 : 0x7c00;
    std::atomic<bool> finite{true};
    for_chunks(n, [&](size_t b, size_t e) {
        uint16_t special = 0;  // branch-free, so the compiler vectorizes the loop
        for (size_t i = b; i < e; ++i) special |= static_cast<uint16_t>((data[i] & exponent) == exponent);
        if (special) finite.store(false, std::memory_order_relaxed);
    });
    return finite.load(std::memory_order_relaxed);
}

bool all_finite(const py::array &a, const std::string &code) {
    if ((code != "bf16" && code != "f16") || a.itemsize() != 2 || !c_contiguous(a) ||
        reinterpret_cast<uintptr_t>(a.data()) % 2 != 0)
        throw std::invalid_argument("all_finite: an aligned C-contiguous bf16 or f16 array expected");
    const auto *data = static_cast<const uint16_t *>(a.data());
    const size_t n = static_cast<size_t>(a.size());
    return without_gil([&] { return all_finite_16(data, n, code); });
}

}  // namespace onednn_convt
