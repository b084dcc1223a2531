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
// Data-parallel ranks unscale the same all-reduced gradients, so they agree on every
// skip without a collective of their own.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>

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
  double scale() const { return scale_; }
  // Divides every bucket by the scale; true when a gradient was inf or NaN (the flag is
  // read once, after every bucket).
  bool unscale(const GradBuckets& buckets);
  // After a step's unscale: halves the scale after an overflow, doubles it after
  // growth_interval clean steps in a row.
  void update(bool overflow);
  int64_t skipped() const { return skipped_; }  // steps skipped over the run

  void save(nlohmann::json& state) const;
  void load(const nlohmann::json& state);

 private:
  LossScaleOptions o_;
  double scale_;
  int64_t clean_ = 0;  // clean steps since the last change of the scale
  int64_t skipped_ = 0;
};

}  // namespace eg::optim
