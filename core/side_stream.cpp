#include "core/side_stream.h"

#include "core/caching_allocator.h"
#include "core/error.h"
#ifdef EG_WITH_CUDA
#include "core/cuda_context.h"
#endif

namespace eg {

SideStream::SideStream(Device d) : device_(d) {
  if (d.is_cpu()) return;
#ifdef EG_WITH_CUDA
  EG_CHECK(d.index >= 0 && d.index < cuda::device_count(), "a side stream on ", d.str(), ": this process sees ",
           cuda::device_count(), " CUDA device(s)");
  stream_ = cuda::borrow_side_stream(d.index);
  evicted_before_ = set_thread_evicts(false);
#else
  EG_THROW("a side stream on ", d.str(), ": this build of egeria has no CUDA backend");
#endif
}

SideStream::~SideStream() {
  if (device_.is_cpu()) return;
#ifdef EG_WITH_CUDA
  // What the thread queued may still use blocks it has freed to the cache (on this stream)
  // and tensors of other streams its owner is about to drop: it finishes first. Errors
  // are ignored (a destructor does not throw): the next synchronisation reports them.
  (void)cudaSetDevice(device_.index);
  if (cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)) != cudaSuccess) (void)cudaGetLastError();
  set_thread_evicts(evicted_before_);
  cuda::return_side_stream();
#endif
}

void SideStream::synchronize() {
  if (device_.is_cpu()) return;
#ifdef EG_WITH_CUDA
  count_host_sync();
  cuda::set_device(device_.index);
  cudaEvent_t done = nullptr;
  EG_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventBlockingSync | cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(done, static_cast<cudaStream_t>(stream_));
  if (e == cudaSuccess) e = cudaEventSynchronize(done);
  (void)cudaEventDestroy(done);
  EG_CUDA_CHECK(e);
#endif
}

struct StreamMark::State {
  Device device;
#ifdef EG_WITH_CUDA
  cudaEvent_t event = nullptr;
  ~State() {
    if (event) (void)cudaEventDestroy(event);  // released once recorded work is done
  }
#endif
};

StreamMark StreamMark::here(Device d, bool timed) {
  StreamMark m;
  if (d.is_cpu()) return m;
#ifdef EG_WITH_CUDA
  m.state_ = std::make_shared<State>();
  m.state_->device = d;
  cuda::set_device(d.index);
  EG_CUDA_CHECK(cudaEventCreateWithFlags(&m.state_->event, timed ? cudaEventDefault : cudaEventDisableTiming));
  EG_CUDA_CHECK(cudaEventRecord(m.state_->event, cuda::current_stream(d.index)));
#else
  (void)timed;
  EG_THROW("a stream mark on ", d.str(), ": this build of egeria has no CUDA backend");
#endif
  return m;
}

void StreamMark::wait() const {
  if (!state_) return;
#ifdef EG_WITH_CUDA
  cuda::set_device(state_->device.index);
  EG_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(state_->device.index), state_->event, 0));
#endif
}

double StreamMark::seconds_since(const StreamMark& earlier) const {
  if (!state_ || !earlier.state_) return 0;
#ifdef EG_WITH_CUDA
  float ms = 0;
  EG_CUDA_CHECK(cudaEventElapsedTime(&ms, earlier.state_->event, state_->event));
  return double(ms) * 1e-3;
#else
  return 0;
#endif
}

Device StreamMark::device() const { return state_ ? state_->device : Device::cpu(); }

}  // namespace eg
