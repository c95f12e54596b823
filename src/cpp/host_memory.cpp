#include "host_memory.hpp"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace onednn_convt {

namespace {

struct Block {
    void *data;
    size_t capacity;
    size_t alignment;
};

struct HostMemory {
    std::mutex mutex;
    std::unordered_map<void *, Block> lent;  // large blocks the library holds
    std::vector<Block> kept;                 // large blocks it freed, oldest first
    size_t kept_bytes = 0;
    size_t reused = 0;
    size_t allocated = 0;
};

HostMemory &state() {
    static auto *memory = new HostMemory;  // never destroyed: the library may free after static teardown
    return *memory;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void *aligned_block(size_t alignment, size_t size) {
    void *p = std::aligned_alloc(alignment, size);
    if (p != nullptr && alignment == kHugePage) madvise(p, size, MADV_HUGEPAGE);
    return p;
}

namespace {

// host_allocate's block, or nullptr where the C library has none
void *try_allocate(size_t size, size_t alignment) {
    alignment = std::max<size_t>(alignment, alignof(std::max_align_t));
    if (size < kKeptFrom) return std::aligned_alloc(alignment, round_up(std::max<size_t>(size, 1), alignment));
    const bool huge = size >= kHugePage;
    const size_t capacity = round_up(size, huge ? kHugePage : size_t{64} << 10);
    HostMemory &m = state();
    {
        std::lock_guard<std::mutex> lock(m.mutex);
        // the smallest kept block that holds it, wasting at most half its size
        auto best = m.kept.end();
        for (auto it = m.kept.begin(); it != m.kept.end(); ++it)
            if (it->capacity >= capacity && it->capacity <= capacity + capacity / 2 && it->alignment % alignment == 0 &&
                (best == m.kept.end() || it->capacity < best->capacity))
                best = it;
        if (best != m.kept.end()) {
            Block b = *best;
            m.kept.erase(best);
            m.kept_bytes -= b.capacity;
            m.lent.emplace(b.data, b);
            ++m.reused;
            return b.data;
        }
    }
    const size_t align = std::max(alignment, huge ? kHugePage : size_t{4096});
    void *p = aligned_block(align, capacity);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(m.mutex);
    m.lent.emplace(p, Block{p, capacity, align});
    ++m.allocated;
    return p;
}

}  // namespace

void *host_allocate(size_t size, size_t alignment) {
    void *p = try_allocate(size, alignment);
    if (p == nullptr) {  // the kept blocks go back to the system, and one more try
        release_host_memory();
        p = try_allocate(size, alignment);
    }
    // Never nullptr: oneDNN 3.2's graph executor writes its temporary buffers through the
    // pointer unchecked (a SIGSEGV in a reorder under `ulimit -v`), so this fails as
    // operator new does, through the library's C++ frames, to CompiledOp::execute.
    if (p == nullptr) throw HostAllocationFailed(size);
    return p;
}

void host_deallocate(void *block) {
    if (block == nullptr) return;
    HostMemory &m = state();
    std::vector<void *> to_free;
    {
        std::lock_guard<std::mutex> lock(m.mutex);
        auto it = m.lent.find(block);
        if (it == m.lent.end()) {
            to_free.push_back(block);  // a small block
        } else {
            const Block b = it->second;
            m.lent.erase(it);
            if (b.capacity > kKeptBytes) {
                to_free.push_back(b.data);
            } else {
                size_t drop = 0;  // the oldest kept blocks make room
                while (m.kept_bytes + b.capacity > kKeptBytes) {
                    m.kept_bytes -= m.kept[drop].capacity;
                    to_free.push_back(m.kept[drop++].data);
                }
                m.kept.erase(m.kept.begin(), m.kept.begin() + static_cast<std::ptrdiff_t>(drop));
                m.kept.push_back(b);
                m.kept_bytes += b.capacity;
            }
        }
    }
    for (void *p : to_free) std::free(p);
}

HostMemoryInfo host_memory_info() {
    HostMemory &m = state();
    std::lock_guard<std::mutex> lock(m.mutex);
    return {m.kept_bytes, m.kept.size(), m.reused, m.allocated};
}

void release_host_memory() {
    HostMemory &m = state();
    std::vector<Block> kept;
    {
        std::lock_guard<std::mutex> lock(m.mutex);
        kept.swap(m.kept);
        m.kept_bytes = 0;
    }
    for (const Block &b : kept) std::free(b.data);
#ifdef __GLIBC__
    if (!kept.empty()) malloc_trim(0);  // the blocks malloc kept in its heap go back to the system too
#endif
}

void host_memory_before_fork() { state().mutex.lock(); }
void host_memory_after_fork_in_parent() { state().mutex.unlock(); }
void host_memory_after_fork_in_child() { new (&state().mutex) std::mutex; }

}  // namespace onednn_convt
