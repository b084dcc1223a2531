// Caching CPU allocator: the policy of Note [Caching allocators] over aligned_alloc.
// Blocks are 64-byte aligned for AVX-512.
#include <cstdlib>

#include "core/caching_allocator.h"
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

class CpuCachingAllocator final : public CachingAllocator {
 public:
  CpuCachingAllocator() : CachingAllocator(allocator_cache_limit(std::getenv("EG_ALLOC_CACHE_LIMIT"))) {}
  ~CpuCachingAllocator() override { empty_cache(); }

 private:
  void* resolve_stream(void*) override { return nullptr; }  // one host "stream": every block serves every request
  void* system_allocate(size_t nbytes) override { return std::aligned_alloc(64, nbytes); }
  void system_free(const std::vector<void*>& blocks) override {
    for (void* p : blocks) std::free(p);
  }
  [[noreturn]] void out_of_memory(size_t nbytes, const AllocatorStats& s) const override {
    EG_THROW("out of host memory allocating ", nbytes, " bytes (", s.allocated, " bytes in use)");
  }
};

}  // namespace

Allocator& cpu_allocator() {
  static auto* a = new CpuCachingAllocator();  // leaked on purpose: tensors may outlive statics
  return *a;
}

}  // namespace eg
