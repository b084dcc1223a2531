#include "core/deferred_read.h"

#include <mutex>
#include <vector>

#include "core/error.h"
#ifdef EG_WITH_CUDA
#include "core/cuda_context.h"
#endif

namespace eg {

#ifdef EG_WITH_CUDA
namespace {
// Pinned 8-byte slots with an event each, reused: cudaHostAlloc costs tens of
// microseconds, too much for one scalar a step. A slot goes back to the pool when its
// last DeferredScalar goes; it is handed out again once its copy has landed.
struct PinnedSlot {
  double* host = nullptr;
  cudaEvent_t landed = nullptr;
};
class SlotPool {
 public:
  PinnedSlot take() {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < free_.size(); ++i)
      if (cudaEventQuery(free_[i].landed) == cudaSuccess) {
        PinnedSlot s = free_[i];
        free_.erase(free_.begin() + std::ptrdiff_t(i));
        return s;
      }
    (void)cudaGetLastError();  // a copy not landed yet is no error
    if (next_ == kPerBlock) {
      void* block = nullptr;
      EG_CUDA_CHECK(cudaHostAlloc(&block, kPerBlock * sizeof(double), cudaHostAllocDefault));
      block_ = static_cast<double*>(block);
      next_ = 0;
    }
    PinnedSlot s;
    s.host = block_ + next_++;
    EG_CUDA_CHECK(cudaEventCreateWithFlags(&s.landed, cudaEventDisableTiming));
    return s;
  }
  void give(const PinnedSlot& s) {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(s);
  }

 private:
  static constexpr size_t kPerBlock = 512;
  std::mutex mu_;
  std::vector<PinnedSlot> free_;
  double* block_ = nullptr;  // pinned blocks live as long as the process
  size_t next_ = kPerBlock;
};
SlotPool& pool() {
  static SlotPool* p = new SlotPool;  // never destroyed: slots may be given back at exit
  return *p;
}
}  // namespace
#endif

struct DeferredScalar::State {
  double value = 0;
  bool landed = true;
  DType dtype = DType::f64;
#ifdef EG_WITH_CUDA
  PinnedSlot slot;
  ~State() {
    if (slot.host) pool().give(slot);
  }
#endif
};

DeferredScalar::DeferredScalar(double known) : state_(std::make_shared<State>()) { state_->value = known; }

DeferredScalar DeferredScalar::of(const Tensor& t) {
  EG_CHECK(t.defined() && t.numel() == 1 && (t.dtype() == DType::f32 || t.dtype() == DType::f64),
           "a value read later is one f32 or f64 element, got ", t.defined() ? t.str() : "nothing");
  DeferredScalar d;
  d.state_ = std::make_shared<State>();
  State& s = *d.state_;
  if (t.device().is_cpu()) {
    const Tensor p = t.to_plain();
    s.value =
        t.dtype() == DType::f32 ? double(*static_cast<const float*>(p.raw())) : *static_cast<const double*>(p.raw());
    return d;
  }
#ifdef EG_WITH_CUDA
  cuda::set_device(t.device().index);
  const cudaStream_t stream = cuda::current_stream(t.device().index);
  s.slot = pool().take();
  s.dtype = t.dtype();
  cudaError_t e = cudaMemcpyAsync(s.slot.host, t.raw(), dtype_size(t.dtype()), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaEventRecord(s.slot.landed, stream);
  if (e != cudaSuccess) {  // a copy may be queued with no event behind it: it lands before the slot goes back
    (void)cudaStreamSynchronize(stream);
    EG_CUDA_CHECK(e);
  }
  s.landed = false;
#endif
  return d;
}

double DeferredScalar::read(bool count) const {
  EG_CHECK(state_, "internal: reading an empty DeferredScalar");
  State& s = *state_;
#ifdef EG_WITH_CUDA
  if (!s.landed) {
    const cudaError_t q = cudaEventQuery(s.slot.landed);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      if (count) count_host_sync();  // Note [Host syncs]
      EG_CUDA_CHECK(cudaEventSynchronize(s.slot.landed));
    } else {
      EG_CUDA_CHECK(q);
    }
    s.value = s.dtype == DType::f32 ? double(*reinterpret_cast<const float*>(s.slot.host)) : *s.slot.host;
    s.landed = true;
  }
#else
  (void)count;
#endif
  return s.value;
}

double DeferredScalar::value() const { return read(true); }
double DeferredScalar::lagged_value() const { return read(false); }

bool DeferredScalar::landed() const {
  if (!state_) return false;
#ifdef EG_WITH_CUDA
  if (!state_->landed) {
    const cudaError_t q = cudaEventQuery(state_->slot.landed);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    EG_CUDA_CHECK(q);
  }
#endif
  return true;
}

struct HostCopy::State {
  Tensor host;
#ifdef EG_WITH_CUDA
  cudaEvent_t landed = nullptr;  // null once waited for (or for a host tensor)
  void wait(bool count) {
    if (!landed) return;
    const cudaError_t q = cudaEventQuery(landed);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not ready is no error
      if (count) count_host_sync();  // Note [Host syncs]
      EG_CUDA_CHECK(cudaEventSynchronize(landed));
    } else {
      EG_CUDA_CHECK(q);
    }
    EG_CUDA_CHECK(cudaEventDestroy(landed));
    landed = nullptr;
  }
  ~State() {
    if (!landed) return;
    // The copy may still write the pinned block: it goes back to the cache after it.
    (void)cudaEventSynchronize(landed);
    (void)cudaEventDestroy(landed);
    (void)cudaGetLastError();  // no error of these is the next check's
  }
#endif
};

HostCopy HostCopy::of(const Tensor& t) {
  EG_CHECK(t.defined(), "internal: a host copy of an undefined tensor");
  HostCopy c;
  c.state_ = std::make_shared<State>();
  if (t.device().is_cpu()) {
    c.state_->host = t.detach();
    return c;
  }
#ifdef EG_WITH_CUDA
  const Tensor src = t.to_plain();  // queued on the device like the copy; its memory is reused only behind it
  c.state_->host = Tensor::empty_pinned(src.shape(), src.dtype());
  cuda::set_device(src.device().index);
  const cudaStream_t stream = cuda::current_stream(src.device().index);
  cudaEvent_t landed = nullptr;
  // The thread that waits for it (the reference's) sleeps rather than spins: it runs
  // beside training, on a core the data loader's workers want.
  EG_CUDA_CHECK(cudaEventCreateWithFlags(&landed, cudaEventBlockingSync | cudaEventDisableTiming));
  cudaError_t e = cudaMemcpyAsync(c.state_->host.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaEventRecord(landed, stream);
  if (e != cudaSuccess) {  // a copy may be queued with no event behind it: wait before the block goes back
    (void)cudaStreamSynchronize(stream);
    (void)cudaEventDestroy(landed);
    EG_CUDA_CHECK(e);
  }
  c.state_->landed = landed;
#endif
  return c;
}

const Tensor& HostCopy::get() const {
  EG_CHECK(state_, "internal: reading an empty HostCopy");
#ifdef EG_WITH_CUDA
  state_->wait(true);
#endif
  return state_->host;
}

}  // namespace eg
