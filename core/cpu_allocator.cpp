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
#include <cstdlib>
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
      p = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) free_.erase(it);
      ++stats_.cache_hits;
    } else {
      p = std::aligned_alloc(64, sz);
      if (!p) {
        empty_cache_locked();
        p = std::aligned_alloc(64, sz);
      }
      EG_CHECK(p, "out of host memory allocating ", nbytes, " bytes (", stats_.allocated, " bytes in use)");
      stats_.reserved += sz;
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
    free_[it->second].push_back(p);
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
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    empty_cache_locked();
  }

 private:
  void empty_cache_locked() {
    for (auto& [sz, v] : free_) {
      for (void* p : v) std::free(p);
      stats_.reserved -= sz * v.size();
    }
    free_.clear();
  }
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // cached blocks by size, for the best fit
  std::unordered_map<void*, size_t> live_;  // handed-out blocks and their sizes
  AllocatorStats stats_;
};

}  // namespace

Allocator& cpu_allocator() {
  static auto* a = new CpuCachingAllocator();  // leaked on purpose: tensors may outlive statics
  return *a;
}

}  // namespace eg
