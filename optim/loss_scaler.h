// Dynamic loss scaling (--loss-scale dynamic), as torch.cuda.amp.GradScaler: fp16's
// smallest normal is 6e-5 and its largest 65504, so gradients computed in fp16 underflow
// unless the loss is first multiplied by a scale S (2^16 to start), and overflow when S
// is too large for the step.
// - Before backward the loss is multiplied by S; after backward (and the gradient sync)
//   every gradient bucket is divided by S in one pass that also raises a found-inf flag
//   (ops::amp_unscale), so the optimizer and gradient clipping see true gradients.
// - A step whose gradients hold an inf or NaN is skipped (no optimizer step: the weights
//   stay as they were) and S is halved; after `growth_interval` clean steps in a row S is
//   doubled. Powers of two keep the scaling exact.
// - The scale and the count of clean steps are part of a checkpoint, so a resumed run
//   scales as the uninterrupted one.
// - The state (scale, clean steps, skipped steps) lives where the gradients are, and the
//   flag, the skip (Optimizer::step_unless) and the update (ops::amp_update_scale) are
//   decided there, as GradScaler's: a step need not read anything on the host; scale()
//   and skipped() read it (a host sync on a GPU).
// Data-parallel ranks unscale the same all-reduced gradients, so they agree on every
// skip without a collective of their own.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "core/tensor.h"
#include "optim/buckets.h"

namespace eg::optim {

struct LossScaleOptions {
  bool dynamic = false;  // off: no scaling (f32 and bf16 need none)
  double init = 65536;  // the first scale, 2^16 as GradScaler's
  int64_t growth_interval = 2000;  // clean steps before the scale doubles
};

class LossScaler {
 public:
  explicit LossScaler(LossScaleOptions o);
  bool enabled() const { return o_.dynamic; }
  double scale() const;  // read from where the state is
  // The scale as one f64 element on `device` (the state moved there first if it is not):
  // what the loss is multiplied by and the gradients divided by.
  Tensor scale_on(Device device);
  // Divides every bucket by the scale; the flag (f32 [1] on the buckets' device) is set
  // when a gradient was inf or NaN. No host read.
  Tensor unscale_on_device(const GradBuckets& buckets);
  // After a step's unscale: halves the scale after an overflow, doubles it after
  // growth_interval clean steps in a row; on the flag's device, no host read.
  void update(const Tensor& found_inf);
  int64_t skipped() const;  // steps skipped over the run (read from where the state is)

  void save(nlohmann::json& state) const;
  void load(const nlohmann::json& state);

 private:
  LossScaleOptions o_;
  Tensor state_;  // f64 [3]: the scale, clean steps since it last changed, skipped steps
  std::vector<double> read() const;
};

}  // namespace eg::optim
