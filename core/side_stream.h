// A thread's own GPU stream beside the compute stream, and marks that order the two.
#pragma once
#include <memory>

#include "core/device.h"

namespace eg {

// Note [Side streams]
// Every thread's work on a GPU goes to the device's one compute stream, in the order the
// threads queue it. Work that the training step does not wait for (the plasticity
// reference's forward on the training GPU: freeze/controller.h) would sit in that queue
// between the step's kernels and delay them. A SideStream lends the calling thread, while
// it lives, a stream of its own on the device, with its own cuBLAS and cuDNN handles:
// everything the thread queues there (kernels, copies, the allocator's requests, the
// syncing copies, which then wait for this stream only) runs beside the compute stream's
// work, in the SMs and the gaps that work leaves (the same priority: a lower one is not
// to be had below the default, and a higher one for training would rank it above NCCL's
// kernels too). The thread's cache misses take memory without evicting (set_thread_evicts
// in core/caching_allocator.h: an eviction would stall the training thread's requests).
// Ordering and memory are the borrower's business, as with PyTorch's streams:
// - a tensor written on the compute stream is read on the side stream after a StreamMark
//   made where it was written (StreamMark::here on the writer's thread, then wait() on
//   the reader's): the side stream waits on the device, no host waits;
// - the caching allocator keys blocks by stream, so the side stream's own allocations are
//   reused only in its order; but a tensor of the compute stream read on the side stream
//   must stay alive until that reading is done (synchronize() before dropping it),
//   else the compute stream may reuse its block while the side stream still reads it.
// On the CPU (and in a build without CUDA) both are no-ops: the host's work is in order.
class SideStream {
 public:
  // Throws, naming the device, when it is not one this process can use.
  explicit SideStream(Device d);
  // Waits for what the thread queued on the stream, then gives it back. On the thread
  // that made it.
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  // Waits, asleep rather than spinning (a spinning thread beside training takes a core
  // from the data loader's workers), until the stream's queued work is done; counted as a
  // host sync of the calling thread (Note [Host syncs] in core/device.h).
  void synchronize();
  Device device() const { return device_; }

 private:
  Device device_;
  void* stream_ = nullptr;  // cudaStream_t
  bool evicted_before_ = true;  // the thread's set_thread_evicts before
};

// A point in the work a thread has queued on a device's stream, for another stream to wait
// for, or to time the work between two marks. Cheap to copy; the event behind it goes
// with the last copy.
class StreamMark {
 public:
  StreamMark() = default;
  // The work queued so far on the calling thread's current stream of `d` (none on the
  // CPU); `timed`: a mark seconds_since() can measure from.
  static StreamMark here(Device d, bool timed = false);
  // Makes the calling thread's current stream on the mark's device wait for it, on the
  // device (the host goes on). Nothing for an empty mark.
  void wait() const;
  // Seconds of device time from `earlier` to this mark, both timed and reached (after
  // a synchronisation); 0 where either is empty.
  double seconds_since(const StreamMark& earlier) const;
  bool empty() const { return state_ == nullptr; }
  Device device() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace eg
