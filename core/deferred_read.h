// A device scalar the host reads later (Note [Deferred reads]).
#pragma once
#include <memory>

#include "core/tensor.h"

namespace eg {

// Note [Deferred reads]
// A training step's loss is a one-element device tensor; reading it at once (item())
// waits for the whole step, so the GPU idles while the host prepares the next one. A
// DeferredScalar starts the value's copy to the host behind the kernels that make it
// (on CUDA: an asynchronous copy into pinned memory on the compute stream and an event)
// and hands it over when asked:
// - value(): waits for the copy if it has not landed, counted as a host sync (Note [Host
//   syncs] in core/device.h): the caller wants this step's value now (a log step, a
//   checkpoint);
// - lagged_value(): the same wait, not counted: the caller has queued later work behind
//   the value (the next step's kernels), so waiting leaves the GPU busy.
// On the CPU the value is read when the DeferredScalar is made: there is nothing to wait
// for. Copies share one read: the first caller's wait serves them all. A DeferredScalar
// may also hold a value the host already knows (the synchronous paths').
class DeferredScalar {
 public:
  DeferredScalar() = default;
  DeferredScalar(double known);  // NOLINT(google-explicit-constructor): a known value reads as one
  // Starts moving the one element of `t` (f32 or f64, any device) to the host.
  static DeferredScalar of(const Tensor& t);

  bool defined() const { return state_ != nullptr; }
  double value() const;
  double lagged_value() const;
  bool landed() const;  // the value is on the host (reading it waits for nothing)

 private:
  struct State;
  double read(bool count) const;
  std::shared_ptr<State> state_;
};

// A tensor's copy on its way to the host, for a thread other than the training thread
// (the plasticity reference's input: freeze/controller.cpp). On CUDA the copy goes into
// page-locked memory (Tensor::empty_pinned) behind the kernels that write the tensor, on
// their stream, with an event: making it waits for nothing, and get() waits for the copy
// (on the calling thread; counted there as a host sync, Note [Host syncs]). A host tensor
// is its own copy, at once. The pinned memory is never handed back while the copy may
// still write it: a HostCopy dropped before its copy landed waits for it.
class HostCopy {
 public:
  HostCopy() = default;
  static HostCopy of(const Tensor& t);

  bool defined() const { return state_ != nullptr; }
  const Tensor& get() const;  // the host tensor (plain layout on CUDA), once it has landed

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace eg
