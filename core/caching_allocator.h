// The caching policy both allocators share (Note [Caching allocators] in
// caching_allocator.cpp); a subclass supplies only the system calls. Internal to core/
// and its tests: users reach the allocators through cpu_allocator() and cuda_allocator().
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.h"

namespace eg {

// What the allocators hold at most, as a multiple of the peak in use, unless
// EG_ALLOC_CACHE_LIMIT says otherwise.
constexpr double kDefaultCacheLimit = 1.5;

class CachingAllocator : public Allocator {
 public:
  // `cache_limit`: what a miss may leave held from the system, as a multiple of the peak
  // in use since the last reset_peak(); 0: no bound.
  explicit CachingAllocator(double cache_limit) : cache_limit_(cache_limit) {}
  // A subclass's destructor calls empty_cache(): the system calls are its own.

  void* allocate(size_t nbytes, void* stream = nullptr) final;
  void deallocate(void* p, size_t nbytes) final;
  AllocatorStats stats() const final;
  void reset_peak() final;
  void empty_cache() final;
  uint64_t create_pool() final;
  void begin_pool(uint64_t pool, uint64_t capture = 0) final;  // the default as Allocator's
  void end_pool() final;
  void end_capture(uint64_t pool, uint64_t capture) final;
  void release_pool(uint64_t pool) final;
  size_t pool_bytes(uint64_t pool) const final;
  double cache_limit() const { return cache_limit_; }

 protected:
  // The stream a request's block belongs to (nullptr on the CPU); makes the allocator's
  // device current. Called without the lock.
  virtual void* resolve_stream(void* stream) { return stream; }
  // A new block of `nbytes` from the system, or nullptr when the system is out of memory.
  virtual void* system_allocate(size_t nbytes) = 0;
  // Hands blocks back. Work still queued on their streams may use them: wait for it first.
  // Throws, if it must, before it frees any.
  virtual void system_free(const std::vector<void*>& blocks) = 0;
  // Throws the error a user reads when even an emptied cache leaves no room.
  [[noreturn]] virtual void out_of_memory(size_t nbytes, const AllocatorStats& s) const = 0;

 private:
  struct Idle {
    void* p;
    size_t size;
    void* stream;
  };
  using IdleList = std::list<Idle>;
  // (stream, block size); the stream as an integer, as pointers to unrelated objects have
  // no order in C++.
  using Key = std::pair<uintptr_t, size_t>;
  static Key key(void* stream, size_t size) { return {reinterpret_cast<uintptr_t>(stream), size}; }

  // Takes the idle block of the best fit on `stream`; nullptr when none is within 2x.
  void* take_cached_locked(size_t size, void* stream, size_t* block);
  // The same from a pool's idle blocks (any stream: the pool's work is one stream's).
  void* take_pooled_locked(uint64_t pool, size_t size, size_t* block, void** stream);
  // The pool this thread draws from and the capture it serves, {0, 0} for none.
  std::pair<uint64_t, uint64_t> active_pool_locked() const;
  // Hands the `count` blocks idle the longest back to the system.
  void release_oldest_locked(size_t count);
  void empty_cache_locked();

  const double cache_limit_;
  mutable std::mutex mu_;
  IdleList lru_;  // cached blocks, idle the longest first
  std::map<Key, std::vector<IdleList::iterator>> free_;  // the same blocks by stream and size
  struct Live {
    void* stream;
    size_t size;
    uint64_t pool;  // 0: the shared cache's
  };
  std::unordered_map<void*, Live> live_;  // handed-out blocks
  struct Pool {
    std::multimap<size_t, Idle> idle;  // by size
    size_t bytes = 0;  // live and idle
    // The named captures each block served; a block whose captures have all ended leaves
    // the pool (blocks of unnamed captures have no entry and stay).
    std::unordered_map<void*, std::vector<uint64_t>> users;
  };
  // Records that `capture` (0: unnamed) used block p of `pool`.
  static void note_user(Pool& pool, void* p, uint64_t capture);
  // Moves an idle block to the shared cache.
  void cache_idle_locked(const Idle& idle);
  std::map<uint64_t, Pool> pools_;
  size_t pooled_ = 0;  // the pools' bytes (counted in stats_.reserved)
  std::map<std::thread::id, std::pair<uint64_t, uint64_t>> active_;  // the threads inside begin_pool(): pool, capture
  uint64_t next_pool_ = 1;
  AllocatorStats stats_;
};

// Whether the calling thread's cache misses on a device may evict (the default), and the
// previous setting. An eviction synchronises the device with the allocator's lock held, so
// every other thread's request waits for the GPU meanwhile: a thread beside training (its
// work on a side stream, Note [Side streams] in core/side_stream.h) takes new memory on a
// miss instead, and the training thread's next miss bounds the cache again. The CPU's
// cache, whose evictions wait for nothing, evicts for every thread.
bool set_thread_evicts(bool on);

// The cache limit the allocators use: `fallback`, or EG_ALLOC_CACHE_LIMIT from the
// environment (passed here as `env`, null when unset): 0 for no bound, or a multiple >= 1.
double allocator_cache_limit(const char* env, double fallback = kDefaultCacheLimit);

}  // namespace eg
