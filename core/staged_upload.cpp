#include "core/staged_upload.h"

#include <algorithm>
#include <cstring>

#ifdef EG_WITH_CUDA
#include "core/cuda_context.h"
#endif

namespace eg {

#ifdef EG_WITH_CUDA
namespace {
cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  EG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
}  // namespace

struct StagedUpload::Slots {
  struct Slot {
    void* pinned = nullptr;
    size_t capacity = 0;
    // The device copy: a view of `block`, which is reused while the staged tensors keep
    // its dtype and fit (translation's batches change shape nearly every step).
    Tensor block, dev;
    cudaEvent_t copied = nullptr, consumed = nullptr;
    bool copy_issued = false, consumer_issued = false;
  };
  Slot slot[2];
  int next = 0, current = -1;
  cudaStream_t copy = nullptr;
  cudaEvent_t compute_mark = nullptr;

  explicit Slots(int device) {
    cuda::set_device(device);
    EG_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    compute_mark = new_event();
    for (Slot& s : slot) s.copied = new_event(), s.consumed = new_event();
  }
  // Waits for every copy still reading a pinned buffer, then frees them (no throwing:
  // this runs while an error unwinds too).
  ~Slots() {
    for (Slot& s : slot) {
      if (s.copy_issued) (void)cudaEventSynchronize(s.copied);
      if (s.pinned) (void)cudaFreeHost(s.pinned);
      (void)cudaEventDestroy(s.copied);
      (void)cudaEventDestroy(s.consumed);
    }
    (void)cudaEventDestroy(compute_mark);
    (void)cudaStreamDestroy(copy);
    (void)cudaGetLastError();  // no error of these is the next check's
  }
};
#else
struct StagedUpload::Slots {};
#endif

StagedUpload::StagedUpload(Device device) : device_(device) {
#ifdef EG_WITH_CUDA
  if (device_.is_cuda()) slots_ = std::make_unique<Slots>(device_.index);
#endif
}

StagedUpload::~StagedUpload() = default;

void StagedUpload::stage(const Tensor& host) {
  EG_CHECK(!staged_, "internal: StagedUpload::stage() before the staged tensor was taken");
  EG_CHECK(host.device().is_cpu(), "internal: StagedUpload stages host tensors, got ", host.str());
  if (!slots_) {
    host_ = host;
    staged_ = true;
    return;
  }
#ifdef EG_WITH_CUDA
  const Tensor src = host.to_plain();
  Slots& ss = *slots_;
  cuda::set_device(device_.index);
  // Its copy stream and events would be drawn into a capture and replayed with whatever
  // the pinned buffer then holds: uploads happen before a capture (Note [Graphed steps]).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  EG_CUDA_CHECK(cudaStreamIsCapturing(cuda::current_stream(device_.index), &capturing));
  EG_CHECK(capturing == cudaStreamCaptureStatusNone,
           "internal: a staged upload inside a CUDA graph capture (a value that changes between replays must be "
           "written before the replay: Note [Graphed steps])");
  Slots::Slot& s = ss.slot[ss.next];
  // The pinned buffer is refilled only once its last copy has read it.
  if (s.copy_issued) {
    const cudaError_t q = cudaEventQuery(s.copied);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not ready is no error
      count_host_sync();  // Note [Host syncs]
      EG_CUDA_CHECK(cudaEventSynchronize(s.copied));
    } else {
      EG_CUDA_CHECK(q);
    }
  }
  // Buffers grow by half at least: batches that grow now and then (translation's) make a
  // few reallocations, not one each (cudaFreeHost may wait for the device).
  const size_t bytes = src.nbytes();
  if (bytes > s.capacity) {
    const size_t cap = std::max(bytes, s.capacity + s.capacity / 2);
    if (s.pinned) EG_CUDA_CHECK(cudaFreeHost(s.pinned));
    s.pinned = nullptr, s.capacity = 0;
    EG_CUDA_CHECK(cudaHostAlloc(&s.pinned, cap, cudaHostAllocDefault));
    s.capacity = cap;
  }
  if (bytes) std::memcpy(s.pinned, src.raw(), bytes);
  const int64_t n = src.numel();
  if (!s.block.defined() || s.block.dtype() != src.dtype() || s.block.numel() < n) {
    // A new block, possibly one the compute stream's queued kernels still use until they
    // run (the allocator is stream-ordered on it): the copy waits for them.
    const bool grow = s.block.defined() && s.block.dtype() == src.dtype();
    s.dev = Tensor();
    s.block = Tensor::empty({grow ? std::max(n, s.block.numel() + s.block.numel() / 2) : n}, src.dtype(), device_);
    EG_CUDA_CHECK(cudaEventRecord(ss.compute_mark, cuda::current_stream(device_.index)));
    EG_CUDA_CHECK(cudaStreamWaitEvent(ss.copy, ss.compute_mark, 0));
  } else if (s.consumer_issued) {
    EG_CUDA_CHECK(cudaStreamWaitEvent(ss.copy, s.consumed, 0));  // its last consumer has read it
  }
  s.dev = s.block.slice(0, n).reshape(src.shape());
  if (bytes) EG_CUDA_CHECK(cudaMemcpyAsync(s.dev.raw(), s.pinned, bytes, cudaMemcpyHostToDevice, ss.copy));
  EG_CUDA_CHECK(cudaEventRecord(s.copied, ss.copy));
  s.copy_issued = true;
  ss.current = ss.next;
  ss.next = 1 - ss.next;
  staged_ = true;
#endif
}

Tensor StagedUpload::take(const std::function<Tensor(const Tensor&)>& consume) {
  EG_CHECK(staged_, "internal: StagedUpload::take() with nothing staged");
  staged_ = false;
  if (!slots_) {
    Tensor h = std::move(host_);
    host_ = Tensor();
    return consume(h);
  }
#ifdef EG_WITH_CUDA
  Slots& ss = *slots_;
  Slots::Slot& s = ss.slot[ss.current];
  cuda::set_device(device_.index);
  cudaStream_t compute = cuda::current_stream(device_.index);
  EG_CUDA_CHECK(cudaStreamWaitEvent(compute, s.copied, 0));
  // The next copy into this buffer waits for what the consumer queued on it, even for a
  // consumer that throws halfway.
  auto consumed = [&] {
    s.consumer_issued = cudaEventRecord(s.consumed, compute) == cudaSuccess;
    return s.consumer_issued;
  };
  Tensor out;
  try {
    out = consume(s.dev);
  } catch (...) {
    (void)consumed();
    throw;
  }
  EG_CHECK(!out.defined() || out.raw_any() != s.dev.raw_any(),
           "internal: a StagedUpload consumer returned the staging buffer itself");
  EG_CHECK(consumed(), "recording a staged upload's consumer on cuda:", device_.index,
           " failed: ", cudaGetErrorString(cudaGetLastError()));
  return out;
#else
  return Tensor();
#endif
}

}  // namespace eg
