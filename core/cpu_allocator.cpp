// Caching CPU allocator.
//
// Note [Caching allocators]
// A training step allocates and frees the same set of activation and gradient sizes
// every iteration. glibc's malloc returns blocks above its mmap threshold to the OS on
// free, so each step pays page faults and zeroing for every large tensor (measured at
// up to 2x the step time). We keep freed blocks in per-size-class free lists and hand
// them out again; empty_cache() returns them. Blocks are 64-byte aligned for AVX-512.
//
// A request takes the smallest cached block of its size class or larger, up to twice
// its class, not only a block of its own class: when the shapes change from step to step
// (a Transformer's length-bucketed batches), exact classes kept a block set for every
// length seen and the cache grew to many times what a step uses; a block at most twice
// the request bounds the waste of a reuse while one long batch's blocks serve the
// shorter ones. A block keeps its own size, so the live map remembers it.
//
// The cache is bounded: when a request misses and the memory held from the system would
// pass kCacheLimit times the peak in use (since the last reset_peak()), the blocks idle
// the longest go back to the system first. Only a miss evicts, never a free, so a step
// whose shapes repeat keeps its whole block set and never reaches the system; with
// changing shapes, blocks of lengths not seen for a while make room for the new ones
// instead of piling up beside them (the best fit alone still held 3x the peak on the
// translation runs).
#include <algorithm>
#include <cstdlib>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace eg {

size_t allocation_size_class(size_t n) {
  if (n == 0) n = 1;
  if (n <= 4096) return (n + 511) & ~size_t(511);
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t quarter = p >> 2;  // p/2 < n <= p: round to multiples of p/8 above p/2
  size_t step = quarter >> 1;
  return ((n + step - 1) / step) * step;
}

namespace {

constexpr double kCacheLimit = 1.5;  // reserved bytes, as a multiple of the peak in use

class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override { empty_cache(); }

  void* allocate(size_t nbytes, void*) override {
    const size_t sz = allocation_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    size_t block = sz;
    auto it = free_.lower_bound(sz);
    if (it != free_.end() && it->first <= 2 * sz) {
      block = it->first;
      auto idle = it->second.back();  // the one freed last: likely still in cache
      p = idle->p;
      it->second.pop_back();
      if (it->second.empty()) free_.erase(it);
      lru_.erase(idle);
      ++stats_.cache_hits;
    } else {
      const double limit = kCacheLimit * double(std::max(stats_.peak_allocated, stats_.allocated + sz));
      while (!lru_.empty() && double(stats_.reserved + sz) > limit) release_oldest_locked();
      p = std::aligned_alloc(64, sz);
      if (!p) {
        empty_cache_locked();
        p = std::aligned_alloc(64, sz);
      }
      EG_CHECK(p, "out of host memory allocating ", nbytes, " bytes (", stats_.allocated, " bytes in use)");
      stats_.reserved += sz;
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
      ++stats_.system_allocs;
    }
    live_.emplace(p, block);
    stats_.allocated += block;
    if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
    return p;
  }

  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    EG_CHECK(it != live_.end(), "freeing host memory this allocator did not hand out");
    lru_.push_back({p, it->second});
    free_[it->second].push_back(std::prev(lru_.end()));
    stats_.allocated -= it->second;
    live_.erase(it);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    empty_cache_locked();
  }

 private:
  struct Idle {
    void* p;
    size_t size;
  };
  using IdleList = std::list<Idle>;

  void release_oldest_locked() {
    const Idle& o = lru_.front();
    auto it = free_.find(o.size);
    // A size's list is in the order its blocks were freed, so its front is the oldest.
    EG_CHECK(it != free_.end() && it->second.front() == lru_.begin(), "cpu allocator: idle lists out of order");
    it->second.erase(it->second.begin());
    if (it->second.empty()) free_.erase(it);
    std::free(o.p);
    stats_.reserved -= o.size;
    ++stats_.system_frees;
    lru_.pop_front();
  }
  void empty_cache_locked() {
    for (const Idle& b : lru_) {
      std::free(b.p);
      stats_.reserved -= b.size;
      ++stats_.system_frees;
    }
    lru_.clear();
    free_.clear();
  }
  mutable std::mutex mu_;
  IdleList lru_;  // cached blocks, idle the longest first
  std::map<size_t, std::vector<IdleList::iterator>> free_;  // the same blocks by size, for the best fit
  std::unordered_map<void*, size_t> live_;  // handed-out blocks and their sizes
  AllocatorStats stats_;
};

}  // namespace

Allocator& cpu_allocator() {
  static auto* a = new CpuCachingAllocator();  // leaked on purpose: tensors may outlive statics
  return *a;
}

}  // namespace eg
