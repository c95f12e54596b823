#include "partition_cache.hpp"

namespace onednn_convt {

std::shared_ptr<const CompiledOp> PartitionCache::get(OpSpec spec) {
    ForkGate gate;  // its lock and the kernels it frees (see before_fork)
    std::string key = spec.key();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = index_.find(key);
        if (it != index_.end()) {
            ++hits_;
            lru_.splice(lru_.begin(), lru_, it->second);
            return it->second->second;
        }
        ++misses_;
    }
    auto op = std::make_shared<const CompiledOp>(std::move(spec));
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second->second;
    if (capacity_ == 0) return op;
    lru_.emplace_front(std::move(key), op);
    index_[lru_.front().first] = lru_.begin();
    evict_locked();
    return op;
}

void PartitionCache::evict_locked() {
    while (lru_.size() > capacity_) {
        index_.erase(lru_.back().first);
        lru_.pop_back();  // freed here unless a caller still holds it
    }
}

CacheInfo PartitionCache::info() const {
    ForkGate gate;
    std::lock_guard<std::mutex> lock(mutex_);
    return {hits_, misses_, lru_.size(), capacity_};
}

void PartitionCache::set_capacity(size_t capacity) {
    ForkGate gate;
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = capacity;
    evict_locked();
}

void PartitionCache::clear() {
    ForkGate gate;
    std::lock_guard<std::mutex> lock(mutex_);
    lru_.clear();
    index_.clear();
    hits_ = misses_ = 0;
}

PartitionCache &global_cache() {
    static PartitionCache cache(256);
    return cache;
}

}  // namespace onednn_convt
