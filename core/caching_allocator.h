// The caching policy both allocators share (Note [Caching allocators] in
// caching_allocator.cpp); a subclass supplies only the system calls. Internal to core/
// and its tests: users reach the allocators through cpu_allocator() and cuda_allocator().
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
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
  // Hands the `count` blocks idle the longest back to the system.
  void release_oldest_locked(size_t count);
  void empty_cache_locked();

  const double cache_limit_;
  mutable std::mutex mu_;
  IdleList lru_;  // cached blocks, idle the longest first
  std::map<Key, std::vector<IdleList::iterator>> free_;  // the same blocks by stream and size
  std::unordered_map<void*, std::pair<void*, size_t>> live_;  // handed-out blocks: stream, size
  AllocatorStats stats_;
};

// The cache limit the allocators use: `fallback`, or EG_ALLOC_CACHE_LIMIT from the
// environment (passed here as `env`, null when unset): 0 for no bound, or a multiple >= 1.
double allocator_cache_limit(const char* env, double fallback = kDefaultCacheLimit);

}  // namespace eg
