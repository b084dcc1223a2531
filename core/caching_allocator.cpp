// The caching policy of both allocators.
//
// Note [Caching allocators]
// A training step allocates and frees the same set of activation and gradient sizes
// every iteration. glibc's malloc returns blocks above its mmap threshold to the OS on
// free, so each step pays page faults and zeroing for every large tensor (measured at
// up to 2x the step time); cudaMalloc/cudaFree synchronise the device and cost tens of
// microseconds each. We keep freed blocks and hand them out again; empty_cache()
// returns them.
//
// A request takes the smallest cached block of its size class or larger, up to twice
// its class, not only a block of its own class: when the shapes change from step to step
// (a Transformer's length-bucketed batches), exact classes kept a block set for every
// length seen and the cache grew to many times what a step uses; a block at most twice the request
// bounds the waste of a reuse while one long batch's blocks serve the shorter ones. A
// block keeps its own size, so the live map remembers it.
//
// The cache is bounded: when a request misses and the memory held from the system would
// pass cache_limit times the peak in use (since the last reset_peak()), the blocks idle
// the longest go back to the system first. Only a miss evicts, never a free, so a step
// whose shapes repeat keeps its whole block set and never reaches the system; with
// changing shapes, blocks of lengths not seen for a while make room for the new ones
// instead of piling up beside them (the best fit alone still holds several times the
// peak when lengths keep changing). EG_ALLOC_CACHE_LIMIT in the environment sets the multiple (0: no
// bound, as PyTorch's CUDA allocator until it runs out of memory).
//
// Blocks are stream-ordered: a block is handed out again only to work on the stream it was
// allocated on. Kernels on one stream run in order, so a block freed after its last use on
// stream S can serve the next op on S with no synchronisation (a block used on another
// stream too must have that stream ordered back onto S before it is freed, as the NCCL
// communicator does); a block goes back to the system (eviction, empty_cache) only after
// the device has finished its queued work.
#include "core/caching_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "core/error.h"

namespace eg {

void* CachingAllocator::allocate(size_t nbytes, void* stream) {
  const size_t sz = allocation_size_class(nbytes);
  stream = resolve_stream(stream);
  std::lock_guard<std::mutex> lock(mu_);
  size_t block = sz;
  void* p = take_cached_locked(sz, stream, &block);
  if (p) {
    ++stats_.cache_hits;
  } else {
    if (cache_limit_ > 0) {
      const double limit = cache_limit_ * double(std::max(stats_.peak_allocated, stats_.allocated + sz));
      size_t count = 0, bytes = 0;
      for (auto it = lru_.begin(); it != lru_.end() && double(stats_.reserved - bytes + sz) > limit; ++it) {
        bytes += it->size;
        ++count;
      }
      release_oldest_locked(count);
    }
    p = system_allocate(sz);
    if (!p) {
      empty_cache_locked();
      p = system_allocate(sz);
    }
    if (!p) out_of_memory(nbytes, stats_);
    stats_.reserved += sz;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    ++stats_.system_allocs;
  }
  live_.emplace(p, std::make_pair(stream, block));
  stats_.allocated += block;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return p;
}

void CachingAllocator::deallocate(void* p, size_t) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  EG_CHECK(it != live_.end(), "allocator: freeing memory it did not hand out");
  const auto [stream, size] = it->second;
  lru_.push_back({p, size, stream});
  free_[key(stream, size)].push_back(std::prev(lru_.end()));
  stats_.allocated -= size;
  live_.erase(it);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

double allocator_cache_limit(const char* env, double fallback) {
  if (!env || !*env) return fallback;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  EG_CHECK(end && *end == '\0' && (v == 0 || (v >= 1 && v < 1e6)), "EG_ALLOC_CACHE_LIMIT=", env,
           ": expected 0 (no bound on the allocators' caches) or the most they may hold as a multiple >= 1 "
           "of the peak in use");
  return v;
}

void* CachingAllocator::take_cached_locked(size_t size, void* stream, size_t* block) {
  const Key want = key(stream, size);
  auto it = free_.lower_bound(want);
  if (it == free_.end() || it->first.first != want.first || it->first.second > 2 * size) return nullptr;
  *block = it->first.second;
  auto idle = it->second.back();  // the one freed last: likely still in the CPU's cache
  void* p = idle->p;
  it->second.pop_back();
  if (it->second.empty()) free_.erase(it);
  lru_.erase(idle);
  return p;
}

void CachingAllocator::release_oldest_locked(size_t count) {
  if (count == 0) return;
  std::vector<void*> blocks;
  size_t bytes = 0;
  auto idle = lru_.begin();
  for (size_t i = 0; i < count; ++i, ++idle) {
    blocks.push_back(idle->p);
    bytes += idle->size;
  }
  // The blocks stay cached until the system has them back: a throw (a failed device sync)
  // leaves the cache as it was.
  system_free(blocks);
  for (size_t i = 0; i < count; ++i) {
    idle = lru_.begin();
    auto it = free_.find(key(idle->stream, idle->size));
    // A (stream, size) list is in the order its blocks were freed, so its front is the oldest.
    EG_CHECK(it != free_.end() && it->second.front() == idle, "allocator: idle lists out of order");
    it->second.erase(it->second.begin());
    if (it->second.empty()) free_.erase(it);
    lru_.pop_front();
  }
  stats_.reserved -= bytes;
  stats_.system_frees += count;
}

void CachingAllocator::empty_cache_locked() { release_oldest_locked(lru_.size()); }

}  // namespace eg
