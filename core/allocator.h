// Allocators. Both cache freed blocks: glibc hands large blocks back to the OS on
// every free, which makes a training step up to 2x slower; CUDA's cudaMalloc/cudaFree
// synchronise the device. See Note [Caching allocators].
#pragma once
#include <cstddef>
#include <cstdint>

namespace eg {

struct AllocatorStats {
  size_t allocated = 0;  // bytes handed out and not yet returned
  size_t reserved = 0;  // bytes held from the system (allocated + cached)
  size_t peak_allocated = 0;  // high-water mark of `allocated`
  size_t peak_reserved = 0;  // high-water mark of `reserved`
  uint64_t system_allocs = 0;  // calls that reached the system allocator
  uint64_t cache_hits = 0;  // requests served from the cache
  uint64_t system_frees = 0;  // cached blocks handed back to the system
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `stream` is the CUDA stream the block is used on (stream-ordered reuse); ignored on CPU.
  virtual void* allocate(size_t nbytes, void* stream = nullptr) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  // Sets both high-water marks to the present values.
  virtual void reset_peak() = 0;
  // Returns every cached (unused) block to the system.
  virtual void empty_cache() = 0;

  // Private pools (Note [Private pools] in core/caching_allocator.cpp): what a CUDA graph's
  // capture allocates stays the graph's. create_pool() names a new pool; between
  // begin_pool(pool) and end_pool() this thread's requests are served from it and the
  // blocks they get return to it when freed; release_pool(pool) hands its idle blocks back
  // to the shared cache (its live ones go there when freed). Several graphs may capture
  // into one pool (Note [Shared graph pools] in core/device_graph.h): `capture` (> 0)
  // names the capture a begin_pool serves, and end_capture(pool, capture), once that
  // graph is gone, hands back the blocks no other capture of the pool used.
  virtual uint64_t create_pool() = 0;
  virtual void begin_pool(uint64_t pool, uint64_t capture = 0) = 0;
  virtual void end_pool() = 0;
  virtual void end_capture(uint64_t pool, uint64_t capture) = 0;
  virtual void release_pool(uint64_t pool) = 0;
  // The bytes a pool holds, in use or idle (0 once released).
  virtual size_t pool_bytes(uint64_t pool) const = 0;
};

Allocator& cpu_allocator();
// Throws eg::Error when egeria was built without CUDA.
Allocator& cuda_allocator(int device = 0);
// Page-locked host memory (cudaHostAlloc), which copies from a GPU fill without the host
// waiting (Tensor::empty_pinned, HostCopy in core/deferred_read.h); the same caching
// policy with no bound on what it holds (it keeps the peak of its use). Without CUDA or a
// GPU it is cpu_allocator().
Allocator& pinned_allocator();

// Size class used by both caching allocators: small sizes round up to 512 bytes,
// large ones to an eighth of their power of two, so a class wastes < 25% of a request.
// Both also hand out a cached block of up to twice the request's class, and bound what
// they hold to 1.5x the peak in use by default (EG_ALLOC_CACHE_LIMIT; Note [Caching
// allocators], core/caching_allocator.cpp).
size_t allocation_size_class(size_t nbytes);

}  // namespace eg
