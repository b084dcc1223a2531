// Host batches moved to a GPU without the host waiting (Note [Staged uploads]).
#pragma once
#include <functional>
#include <memory>

#include "core/tensor.h"

namespace eg {

// Note [Staged uploads]
// Tensor::to(cuda) waits for the copy (the host may reuse pageable memory as soon as it
// returns), and the copy runs on the compute stream, after the last step's kernels: the
// GPU idles while the host copies, and the host while the GPU finishes. A StagedUpload
// moves a host tensor in two halves instead:
// - stage(host), as soon as the batch is known (while the GPU still runs the step
//   before): the bytes go into a pinned buffer, and a copy stream of its own moves them
//   into a device buffer, both kept per slot and reused (grown by half at least when a
//   batch does not fit: translation's batches change shape nearly every step, and a
//   new device block makes the copy wait for the compute stream);
// - take(consume), where the step needs it: the compute stream waits for that copy (an
//   event, not the host), and `consume` turns the device buffer into the step's own
//   tensor (a clone, or ops::image_normalize of pixels) with kernels on the compute
//   stream, after which an event marks the slot's device buffer free again.
// Two slots alternate, so the copy of step k + 1's batch never waits for step k's use of
// the other slot; the copy into a slot waits (on the copy stream) for its last consumer.
// The host waits only to refill a pinned buffer whose copy has not finished, counted as a
// host sync then (Note [Host syncs]): with a batch staged per step, never in practice.
// On the CPU there is nothing to move: take() hands `consume` the host tensor itself.
class StagedUpload {
 public:
  explicit StagedUpload(Device device);
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // Starts moving `host` (a plain host tensor) to the device; one staged tensor at a time.
  void stage(const Tensor& host);
  bool staged() const { return staged_; }
  // The staged tensor as `consume` makes it from its device copy. `consume` must return a
  // tensor of its own: the copy's buffer is reused for a later stage().
  Tensor take(const std::function<Tensor(const Tensor&)>& consume);

  Device device() const { return device_; }

 private:
  struct Slots;  // CUDA: pinned and device buffers, events, the copy stream
  Device device_;
  std::unique_ptr<Slots> slots_;
  Tensor host_;  // the CPU's staged tensor
  bool staged_ = false;
};

}  // namespace eg
