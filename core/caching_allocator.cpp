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
// peak when lengths keep changing). A thread beside training that must not stall it (its
// work on a side stream) never evicts: set_thread_evicts. EG_ALLOC_CACHE_LIMIT in the environment sets the multiple (0: no
// bound, as PyTorch's CUDA allocator until it runs out of memory).
//
// Blocks are stream-ordered: a block is handed out again only to work on the stream it was
// allocated on. Kernels on one stream run in order, so a block freed after its last use on
// stream S can serve the next op on S with no synchronisation (a block used on another
// stream too must have that stream ordered back onto S before it is freed, as the NCCL
// communicator does); a block goes back to the system (eviction, empty_cache) only after
// the device has finished its queued work.
//
// Note [Private pools]
// A CUDA graph replays its kernels at the addresses they had when it was captured, so
// every block the captured step allocated must be the graph's for as long as the graph
// lives: no other tensor may be given it, and it may not go back to the system. While a
// thread is inside begin_pool(P) (the capture), its requests take P's idle blocks first,
// then the shared cache's (the block becomes P's: its last use is queued on the stream
// the graph will replay on, so ordered before it), then the system's; a block of P freed
// (inside the capture, or later by a tensor the graph's outputs kept) goes back to P, where
// only the capture's later requests find it: a reuse inside the capture is one the replay
// repeats in the same order, as stream order makes it safe in an eager step. A block made
// before the capture and freed inside it becomes P's too (captured kernels used it). Nothing
// is evicted while any pool is being filled (handing a block back synchronises the device,
// which a capture forbids), and the cache's bound leaves the pools' blocks out (they are
// not the cache's to hand back). release_pool(P), when the graph is destroyed, makes P's
// idle blocks the shared cache's again. Several graphs may capture into one pool, one
// after another (Note [Shared graph pools] in core/device_graph.h): a later capture's
// requests take the blocks the earlier ones freed. A capture named in begin_pool is
// recorded as a user of every block it was handed or freed; end_capture, once its graph
// is gone, removes it, and a block no remaining capture used leaves the pool for the
// shared cache (at once when idle, else when freed): a dropped graph's memory serves the
// eager steps again instead of waiting in the pool for a capture that fits it. PyTorch's
// caching allocator keeps graph pools the same way.
#include "core/caching_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace eg {

namespace {
thread_local bool t_evicts = true;
}  // namespace

bool set_thread_evicts(bool on) { return std::exchange(t_evicts, on); }

void* CachingAllocator::allocate(size_t nbytes, void* stream) {
  const size_t sz = allocation_size_class(nbytes);
  stream = resolve_stream(stream);
  std::lock_guard<std::mutex> lock(mu_);
  size_t block = sz;
  const auto [pool, capture] = active_pool_locked();
  void* p = pool ? take_pooled_locked(pool, sz, &block, &stream) : nullptr;
  if (p) {
    ++stats_.cache_hits;
    note_user(pools_.at(pool), p, capture);
    live_.emplace(p, Live{stream, block, pool});
    stats_.allocated += block;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return p;
  }
  p = take_cached_locked(sz, stream, &block);
  if (p) {
    ++stats_.cache_hits;
  } else {
    // No eviction while a pool fills (Note [Private pools]), nor on a device by a thread that
    // may not (a host block goes back without a device sync: the CPU's cache evicts as ever).
    if (cache_limit_ > 0 && active_.empty() && (t_evicts || !stream)) {
      // The pools' blocks are not the cache's to bound: what they hold is left out.
      const double limit = cache_limit_ * double(std::max(stats_.peak_allocated, stats_.allocated + sz));
      const size_t shared = stats_.reserved - pooled_;
      size_t count = 0, bytes = 0;
      for (auto it = lru_.begin(); it != lru_.end() && double(shared - bytes + sz) > limit; ++it) {
        bytes += it->size;
        ++count;
      }
      release_oldest_locked(count);
    }
    p = system_allocate(sz);
    if (!p && active_.empty()) {
      empty_cache_locked();
      p = system_allocate(sz);
    }
    if (!p) out_of_memory(nbytes, stats_);
    stats_.reserved += sz;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    ++stats_.system_allocs;
  }
  live_.emplace(p, Live{stream, block, pool});
  if (pool) {
    Pool& P = pools_.at(pool);
    P.bytes += block, pooled_ += block;
    note_user(P, p, capture);
  }
  stats_.allocated += block;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return p;
}

void CachingAllocator::deallocate(void* p, size_t) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  EG_CHECK(it != live_.end(), "allocator: freeing memory it did not hand out");
  Live l = it->second;
  const auto [active, capture] = active_pool_locked();
  if (!l.pool) {  // a block made before a capture and freed inside it: the graph's kernels use it
    l.pool = active;
    if (l.pool) pools_.at(l.pool).bytes += l.size, pooled_ += l.size;
  }
  auto pool = l.pool ? pools_.find(l.pool) : pools_.end();
  if (pool != pools_.end()) {
    Pool& P = pool->second;
    if (l.pool == active) note_user(P, p, capture);  // freed inside a capture: its kernels may use it
    auto u = P.users.find(p);
    if (u != P.users.end() && u->second.empty()) {  // every capture that used it has ended
      P.users.erase(u);
      P.bytes -= l.size, pooled_ -= l.size;
      cache_idle_locked({p, l.size, l.stream});
    } else {
      P.idle.emplace(l.size, Idle{p, l.size, l.stream});
    }
  } else {  // the shared cache's, or its pool was released
    cache_idle_locked({p, l.size, l.stream});
  }
  stats_.allocated -= l.size;
  live_.erase(it);
}

uint64_t CachingAllocator::create_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_pool_++;
  pools_.emplace(id, Pool{});
  return id;
}

void CachingAllocator::begin_pool(uint64_t pool, uint64_t capture) {
  std::lock_guard<std::mutex> lock(mu_);
  EG_CHECK(pools_.count(pool), "allocator: begin_pool of pool ", pool, ", which does not exist");
  EG_CHECK(active_.emplace(std::this_thread::get_id(), std::pair{pool, capture}).second,
           "allocator: begin_pool on a thread already drawing from a pool");
}

void CachingAllocator::end_capture(uint64_t pool, uint64_t capture) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end() || capture == 0) return;
  const std::pair<uint64_t, uint64_t> drawing{pool, capture};
  for (auto& a : active_)
    EG_CHECK(a.second != drawing, "allocator: end_capture of capture ", capture,
             " while a thread draws from the pool for it");
  Pool& P = it->second;
  for (auto& [p, captures] : P.users)
    captures.erase(std::remove(captures.begin(), captures.end(), capture), captures.end());
  // Idle blocks no remaining capture used go to the shared cache now; live ones when freed.
  for (auto i = P.idle.begin(); i != P.idle.end();) {
    auto u = P.users.find(i->second.p);
    if (u == P.users.end() || !u->second.empty()) {
      ++i;
      continue;
    }
    P.users.erase(u);
    P.bytes -= i->first, pooled_ -= i->first;
    cache_idle_locked(i->second);
    i = P.idle.erase(i);
  }
}

void CachingAllocator::note_user(Pool& pool, void* p, uint64_t capture) {
  if (capture == 0) return;
  std::vector<uint64_t>& captures = pool.users[p];
  if (std::find(captures.begin(), captures.end(), capture) == captures.end()) captures.push_back(capture);
}

void CachingAllocator::cache_idle_locked(const Idle& idle) {
  lru_.push_back(idle);
  free_[key(idle.stream, idle.size)].push_back(std::prev(lru_.end()));
}

void CachingAllocator::end_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  EG_CHECK(active_.erase(std::this_thread::get_id()) == 1, "allocator: end_pool without begin_pool");
}

void CachingAllocator::release_pool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) return;
  for (auto& a : active_)
    EG_CHECK(a.second.first != pool, "allocator: release_pool of pool ", pool, " while a thread draws from it");
  for (auto& [size, idle] : it->second.idle) cache_idle_locked(idle);
  pooled_ -= it->second.bytes;
  pools_.erase(it);  // its live blocks, when freed, go to the shared cache
}

size_t CachingAllocator::pool_bytes(uint64_t pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? 0 : it->second.bytes;
}

std::pair<uint64_t, uint64_t> CachingAllocator::active_pool_locked() const {
  if (active_.empty()) return {0, 0};
  auto it = active_.find(std::this_thread::get_id());
  return it == active_.end() ? std::pair<uint64_t, uint64_t>{0, 0} : it->second;
}

void* CachingAllocator::take_pooled_locked(uint64_t pool, size_t size, size_t* block, void** stream) {
  auto& idle = pools_.at(pool).idle;
  auto it = idle.lower_bound(size);
  if (it == idle.end() || it->first > 2 * size) return nullptr;
  *block = it->first;
  *stream = it->second.stream;
  void* p = it->second.p;
  idle.erase(it);
  return p;
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
