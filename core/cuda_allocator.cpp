// Caching CUDA allocator: the stream-ordered policy of Note [Caching allocators] over
// cudaMalloc/cudaFree, one per device.
#include <cstdlib>
#include <vector>

#include "core/caching_allocator.h"
#include "core/cuda_context.h"

namespace eg {

namespace {

class CudaCachingAllocator final : public CachingAllocator {
 public:
  explicit CudaCachingAllocator(int device)
      : CachingAllocator(allocator_cache_limit(std::getenv("EG_ALLOC_CACHE_LIMIT"))), device_(device) {}
  ~CudaCachingAllocator() override { empty_cache(); }

 private:
  void* resolve_stream(void* stream) override {
    cuda::set_device(device_);  // kernels on the block launch on the current device's stream
    return stream ? stream : static_cast<void*>(cuda::current_stream(device_));
  }
  void* system_allocate(size_t nbytes) override {
    cuda::set_device(device_);
    void* p = nullptr;
    // A capture (Note [Private pools]) forbids cudaMalloc on its thread unless relaxed: the
    // block is the graph's for as long as the graph lives, so its address holds at replay.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    EG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t e = cudaMalloc(&p, nbytes);
    EG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();  // so that the next kernel launch check does not report it
    if (e == cudaErrorMemoryAllocation) return nullptr;
    EG_THROW("cudaMalloc of ", nbytes, " bytes on cuda:", device_, " failed: ", cudaGetErrorString(e));
  }
  void system_free(const std::vector<void*>& blocks) override {
    cuda::set_device(device_);
    // Kernels queued on the blocks' streams may still read or write them. A failed sync
    // throws before any block is freed (the cache keeps them).
    count_host_sync();  // Note [Host syncs] in core/device.h
    EG_CUDA_CHECK(cudaDeviceSynchronize());
    for (void* p : blocks) EG_CUDA_CHECK(cudaFree(p));
  }
  [[noreturn]] void out_of_memory(size_t nbytes, const AllocatorStats& s) const override {
    EG_THROW("CUDA out of memory on cuda:", device_, " allocating ", nbytes, " bytes (", s.allocated, " bytes in use, ",
             s.reserved, " reserved after handing the cache back)");
  }
  int device_;
};

// Page-locked host blocks. A block comes back only once its copy has landed (HostCopy
// waits for it first), so freeing one waits for nothing. No bound on what it holds: an
// eviction would call cudaFreeHost, which may synchronise the device, from a training
// step; pinned memory is held at the peak of its use.
class PinnedCachingAllocator final : public CachingAllocator {
 public:
  PinnedCachingAllocator() : CachingAllocator(0) {}
  ~PinnedCachingAllocator() override { empty_cache(); }

 private:
  void* system_allocate(size_t nbytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) return nullptr;
    EG_THROW("cudaHostAlloc of ", nbytes, " bytes failed: ", cudaGetErrorString(e));
  }
  void system_free(const std::vector<void*>& blocks) override {
    for (void* p : blocks) EG_CUDA_CHECK(cudaFreeHost(p));
  }
  [[noreturn]] void out_of_memory(size_t nbytes, const AllocatorStats& s) const override {
    EG_THROW("out of page-locked host memory allocating ", nbytes, " bytes (", s.allocated, " bytes in use, ",
             s.reserved, " reserved after handing the cache back)");
  }
};

}  // namespace

Allocator& pinned_allocator() {
  if (cuda::device_count() == 0) return cpu_allocator();
  static auto* a = new PinnedCachingAllocator();  // leaked on purpose, as the CPU allocator
  return *a;
}

Allocator& cuda_allocator(int device) {
  EG_CHECK(device >= 0 && device < cuda::device_count(), "CUDA device ", device, " is not available (",
           cuda::device_count(), " visible GPUs)");
  static std::mutex mu;
  static std::vector<CudaCachingAllocator*> all;  // leaked on purpose, as the CPU allocator
  std::lock_guard<std::mutex> l(mu);
  if (all.empty()) all.resize(size_t(cuda::device_count()), nullptr);
  if (!all[size_t(device)]) all[size_t(device)] = new CudaCachingAllocator(device);
  return *all[size_t(device)];
}

}  // namespace eg
