// Per-thread f32 scratch memory for emulated low-precision calls (spec D10).
//
// An emulated call converts its bf16/f16 inputs to f32, runs the f32 partition and rounds
// the f32 result back. Fresh buffers for those f32 copies cost page faults on every call
// (glibc returns large freed blocks to the kernel): converting 4M f16 values into a fresh
// 16 MB buffer took 1.10 ms here, into a reused one 0.59 ms. Each thread keeps one buffer
// instead, grown to the largest call it has run, up to kKeepBytes. A larger call's buffer
// goes back to the engine's kept blocks (host_memory.hpp, up to 256 MiB in all) when it
// ends, where the next large call finds it: given back to the system, it cost WaveGAN's
// k25 s4 layer (64x64x4096, bf16 on an AVX2 Zen3) about 40 ms of page faults a call, three
// times its f32 kernel's time.
#pragma once

#include <cstddef>
#include <new>

#include "host_memory.hpp"

namespace onednn_convt {

class Staging {
public:
    static constexpr size_t kKeepBytes = size_t{64} << 20;
    static constexpr size_t kAlign = 64;  // a cache line: oneDNN's kernels like it

    Staging() = default;
    Staging(const Staging &) = delete;
    Staging &operator=(const Staging &) = delete;
    ~Staging() { host_deallocate(data_); }

    // At least `floats` f32 elements, 64-byte aligned, valid until release() or the next get().
    float *get(size_t floats) {
        const size_t bytes = (floats * sizeof(float) + kAlign - 1) / kAlign * kAlign;
        if (bytes > capacity_) {
            clear();
            data_ = static_cast<float *>(host_allocate(bytes, kAlign));
            capacity_ = bytes;
        }
        return data_;
    }

    // Ends a call: a buffer larger than kKeepBytes goes back to the kept blocks.
    void release() {
        if (capacity_ > kKeepBytes) clear();
    }

    // Gives the buffer back (the next call allocates again).
    void clear() {
        host_deallocate(data_);
        data_ = nullptr;
        capacity_ = 0;
    }

    size_t capacity() const { return capacity_; }

    // The calling thread's scratch.
    static Staging &local() {
        thread_local Staging staging;
        return staging;
    }

private:
    float *data_ = nullptr;
    size_t capacity_ = 0;
};

// Offset of a region in floats, rounded up so that every region starts 64-byte aligned.
inline size_t aligned_floats(size_t floats) {
    constexpr size_t step = Staging::kAlign / sizeof(float);
    return (floats + step - 1) / step * step;
}

}  // namespace onednn_convt
