// Gradient buckets: the gradients of the active (trainable) parameters live in a few
// flat buffers, and each parameter's .grad is a view into one of them.
//
// Note [Gradient buckets]
// - Buckets are in gradient-ready order: the reverse of the parameters' order, since
//   backward reaches the last layers first. A bucket holds parameters of one device and
//   dtype up to a cap, as PyTorch DDP: the first bucket up to `first_cap_bytes` (1 MiB),
//   so that the first all-reduce starts early in backward, the others up to `cap_bytes`
//   (25 MiB); one larger parameter gets a bucket of its own.
// - The unit of work is the bucket: zeroing gradients is one fill per bucket, the
//   gradient norm one reduction per bucket, and a data-parallel all-reduce (or a
//   frozen module's exclusion from it, §4 of the paper) works on buckets().
// - Buckets are rebuilt whenever the set of parameters that require grad changes: a
//   freeze or an unfreeze. A frozen parameter is in no bucket and owns no gradient
//   memory. The optimizer checks the set at every zero_grad(), so whoever freezes
//   modules (freeze::apply_frozen_prefix, or module.freeze() by hand) needs to tell it
//   nothing.
// - The autograd engine accumulates into an existing .grad in place, so a gradient
//   that lives in a bucket stays there through backward.
// - The per-parameter update kernels run on the views; their result is the same as on
//   separately allocated gradients, bit for bit.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace eg::optim {

struct GradBucket {
  Tensor flat;  // 1-D, every member's gradient back to back
  std::vector<size_t> members;  // indices into the parameter list, in gradient-ready order
};

constexpr size_t kDefaultBucketCap = size_t(25) << 20, kDefaultFirstBucketCap = size_t(1) << 20;

class GradBuckets {
 public:
  explicit GradBuckets(size_t cap_bytes = kDefaultBucketCap, size_t first_cap_bytes = kDefaultFirstBucketCap)
      : cap_(cap_bytes), first_cap_(first_cap_bytes) {}
  // New caps take effect at the next rebuild, which they force.
  void set_caps(size_t cap_bytes, size_t first_cap_bytes);
  // Rebuilds the buckets when the parameters requiring grad differ from the last
  // build; returns true when it did. Gradients already present are carried over
  // (copied into their new views); frozen parameters' gradients are dropped.
  bool sync(const std::vector<Tensor>& params);
  void zero();  // one fill per bucket
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  size_t bytes() const;  // gradient memory in buckets
  // A hash of the layout (each bucket's members and size): ranks that would all-reduce
  // different buckets have different hashes.
  uint64_t layout_hash() const;
  int64_t rebuilds() const { return rebuilds_; }

 private:
  size_t cap_, first_cap_;
  std::vector<GradBucket> buckets_;
  std::vector<bool> active_;  // requires_grad of each parameter at the last build
  int64_t rebuilds_ = 0;
};

}  // namespace eg::optim
