// A bounded, thread-safe LRU cache of compiled ops keyed by OpSpec::key().
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "compiled_op.hpp"

namespace onednn_convt {

struct CacheInfo {
    size_t hits, misses, size, capacity;
};

class PartitionCache {
public:
    explicit PartitionCache(size_t capacity) : capacity_(capacity) {}

    // Returns the cached op for spec, compiling it on a miss. Compilation runs outside the
    // lock, so two threads missing on the same key may both compile; the first one stored
    // wins and both callers get a working op.
    std::shared_ptr<const CompiledOp> get(OpSpec spec);

    CacheInfo info() const;
    void set_capacity(size_t capacity);
    void clear();

private:
    using Entry = std::pair<std::string, std::shared_ptr<const CompiledOp>>;
    void evict_locked();

    mutable std::mutex mutex_;
    size_t capacity_;
    size_t hits_ = 0, misses_ = 0;
    std::list<Entry> lru_;  // most recently used first
    std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

PartitionCache &global_cache();

}  // namespace onednn_convt
