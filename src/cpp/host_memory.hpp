// The host memory oneDNN's graph API allocates through our engine: the temporary buffers a
// compiled partition takes at every execution (its internal reorders, its primitives'
// scratchpad) and frees when the execution ends.
//
// Taken from malloc, a block above glibc's mmap threshold comes back as fresh pages on every
// call, one page fault and one zeroed 4 KiB page at a time. Measured on an AMD Zen5 KVM
// guest: HiFi-GAN's 1-D k4 s2 up-sampler (16x64x4096 f32 NCX forward), whose partition
// reorders src and dst around a channels-last kernel, ran at 14 ms a call in some processes
// and 4.7 ms in others (whether glibc had raised its threshold); the reorder of src alone
// took 4.3 ms against 1.3. Here large blocks are kept for the next execution instead.
#pragma once

#include <cstddef>
#include <new>

namespace onednn_convt {

// What host_allocate throws where the C library has no block of `bytes` (out of memory, or
// past the process's address-space limit), after the kept blocks went back to the system.
struct HostAllocationFailed : std::bad_alloc {
    size_t bytes;
    explicit HostAllocationFailed(size_t n) : bytes(n) {}
    const char *what() const noexcept override { return "onednn_convt: host allocation failed"; }
};

// The engine allocator's two callbacks (dnnl_graph_host_allocate_f / _deallocate_f).
// Also the allocator of the large arrays the binding makes (host_array in bindings.hpp).
// Blocks from kKeptFrom bytes are rounded up (to 2 MiB from 2 MiB, aligned there and offered
// transparent huge pages), and freed ones are kept, up to kKeptBytes in all, for the next
// request they fit; smaller blocks go straight to the C library. Thread-safe. Never returns
// nullptr: throws HostAllocationFailed.
void *host_allocate(size_t size, size_t alignment);
void host_deallocate(void *block);

struct HostMemoryInfo {
    size_t kept_bytes;   // freed by the library, kept for reuse
    size_t kept_blocks;
    size_t reused;       // large requests served from kept blocks
    size_t allocated;    // large requests that took new memory
};
HostMemoryInfo host_memory_info();
// Returns every kept block to the system (blocks still lent stay).
void release_host_memory();
// Fork: the lock is taken before (after the binding's fork gate) and released after, in
// both processes, so that the child never inherits it held.
void host_memory_before_fork();
void host_memory_after_fork_in_parent();
void host_memory_after_fork_in_child();

// `size` bytes (a multiple of `alignment`) from the C library; where `alignment` is
// kHugePage, offered transparent huge pages (madvise: a hint, its failure harmless), so
// that a large fresh block costs a few page faults rather than one per 4 KiB. nullptr if
// there is no memory. Freed with std::free.
constexpr size_t kHugePage = size_t{2} << 20;
void *aligned_block(size_t alignment, size_t size);

constexpr size_t kKeptFrom = size_t{1} << 20;
constexpr size_t kKeptBytes = size_t{256} << 20;

}  // namespace onednn_convt
