// Caching CUDA allocator, stream-ordered (see Note [Caching allocators]).
// cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so freed
// blocks are kept in bins keyed by (stream, size class) and handed out again only
// to work on the stream that freed them: kernels on one stream run in order, so a
// block freed after its last use on stream S can be reused by the next op on S with
// no synchronisation. Blocks move to another stream only through empty_cache().
#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_context.h"

namespace eg {

namespace {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes, void* stream) override {
    const size_t sz = allocation_size_class(nbytes);
    cuda::set_device(device_);
    cudaStream_t st = stream ? static_cast<cudaStream_t>(stream) : cuda::current_stream(device_);
    std::lock_guard<std::mutex> l(mu_);
    void* p = nullptr;
    auto it = free_.find({st, sz});
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      ++stats_.cache_hits;
    } else {
      cudaError_t e = cudaMalloc(&p, sz);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cached_locked();
        e = cudaMalloc(&p, sz);
      }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        EG_THROW("CUDA out of memory on cuda:", device_, " allocating ", nbytes, " bytes (", stats_.allocated,
                 " bytes in use, ", stats_.reserved, " reserved): ", cudaGetErrorString(e));
      }
      stats_.reserved += sz;
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
      ++stats_.system_allocs;
    }
    live_[p] = {st, sz};
    stats_.allocated += sz;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return p;
  }

  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> l(mu_);
    auto it = live_.find(p);
    EG_CHECK(it != live_.end(), "CUDA allocator: freeing a pointer it did not allocate");
    free_[it->second].push_back(p);
    stats_.allocated -= it->second.second;
    live_.erase(it);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> l(mu_);
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> l(mu_);
    release_cached_locked();
  }

 private:
  using Key = std::pair<cudaStream_t, size_t>;
  void release_cached_locked() {
    // Work queued on the owning streams may still use the blocks: wait for it.
    EG_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [k, v] : free_) {
      for (void* p : v) EG_CUDA_CHECK(cudaFree(p));
      stats_.reserved -= k.second * v.size();
      stats_.system_frees += v.size();
    }
    free_.clear();
  }
  int device_;
  mutable std::mutex mu_;
  std::map<Key, std::vector<void*>> free_;
  std::unordered_map<void*, Key> live_;
  AllocatorStats stats_;
};

}  // namespace

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
