// Optimizers over a list of parameters, with fused update kernels: the multi-tensor
// ops::sgd_step_multi and ops::adamw_step_multi (one launch per 32 parameters on CUDA,
// the learning rate and AdamW's step counts read from the device, so that their launches
// carry no value the schedule changes: Note [Op records]), ops::sgd_step for a
// parameter's first step with momentum; their bits are the per-parameter ops' (tested).
// A parameter that does not require grad (frozen) or has no gradient is skipped, and its
// state is kept: see Note [Freezing a module].
// Gradients of the parameters that require grad live in buckets (optim/buckets.h),
// rebuilt at zero_grad() whenever that set has changed. As with PyTorch's
// zero_grad(set_to_none=False), a trainable parameter then always has a gradient, and
// one that took no part in a step is updated with a zero gradient (weight decay and
// momentum still apply).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/deferred_read.h"
#include "core/staged_upload.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "optim/buckets.h"

namespace eg::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // step() unless `found_inf` (f32 [1] on the parameters' device, loss scaling's flag) is
  // set, decided on the device: the multi-tensor launches write nothing then (a
  // per-parameter path reads the flag, once).
  void step_unless(const Tensor& found_inf) {
    skip_if_ = found_inf;
    step();
    skip_if_ = Tensor();
  }
  // Zeroes the gradients of the parameters that require grad: one fill per bucket,
  // after rebuilding the buckets if the set of those parameters changed (a freeze or
  // an unfreeze).
  void zero_grad();
  // Scales the gradients of the parameters that require grad so that their global L2
  // norm is at most max_norm, and returns the norm before: one reduction and at most one
  // scale per bucket. A NaN/Inf norm is returned and nothing scaled (callers stop).
  double clip_grad_norm(double max_norm);
  // The same without a host read (Note [Deferred reads] in core/deferred_read.h): the norm
  // and the coefficient computed on the buckets' device (ops::clip_coef), every bucket
  // scaled by it (ops::scale_by, whose kernels skip a coefficient of 1 in place: within the
  // bound the gradients are not touched),
  // the norm on its way to the host. A NaN/Inf norm scales nothing: the update then takes
  // the unclipped gradients and the caller, reading the norm, stops before anything is
  // saved. Buckets other than f32 (a model of f64 parameters) are read at once.
  DeferredScalar clip_grad_norm_later(double max_norm);
  // The same with the norm left on the device (one f64 element; on the host for buckets
  // other than f32, read at once), as a captured step leaves it (Strategy::step_on_device).
  Tensor clip_grad_norm_on_device(double max_norm);
  const GradBuckets& grad_buckets() const { return buckets_; }
  // The buckets' caps in bytes (optim/buckets.h); the next zero_grad() rebuilds them.
  void set_bucket_caps(size_t cap_bytes, size_t first_cap_bytes) { buckets_.set_caps(cap_bytes, first_cap_bytes); }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  const std::vector<Tensor>& params() const { return params_; }
  // Before a replayed step (Note [Graphed steps] in train/graphed_step.h): the learning
  // rate written where the multi-tensor kernels read it (no host wait). What else a step
  // changes is on the device (AdamW's step counts), so a replay leaves nothing to do after.
  void prepare_replay(Device device) { (void)lr_on(device); }
  // Throws, naming why, when the last step() launched a value a replay would repeat (a
  // per-parameter path's learning rate or bias correction; a momentum buffer's first step).
  virtual void check_replayable() const {}
  // Before a capture (Note [Graphed steps]): whether the next step() would launch only
  // what a replay repeats rightly. False while a momentum buffer has still to take its
  // first step (host-launched, and reading loss scaling's flag on the host: a capture
  // forbids both), which an overflowing fp16 step puts off; throws, naming why, where no
  // step of these parameters ever would (several devices or dtypes).
  virtual bool ready_to_capture() const { return true; }
  // Optimizer state as named tensors ("3.momentum"), for checkpoints.
  virtual std::map<std::string, Tensor> state_dict() const = 0;
  virtual void load_state_dict(const std::map<std::string, Tensor>& sd) = 0;

 protected:
  bool active(const Tensor& p) const { return p.requires_grad() && p.grad().defined(); }
  // The learning rate as the multi-tensor ops read it: f64 [1] on `device`, rewritten when
  // lr() has changed since (on CUDA through a staged upload: the host does not wait).
  const Tensor& lr_on(Device device);
  // Whether the members (indices into params_) share one device and dtype and no two
  // start at one address, as one multi-tensor call needs.
  bool uniform(const std::vector<size_t>& members) const;
  // The parameters a step() updates now (indices into params_).
  std::vector<size_t> active_members() const;
  // Throws `who`'s message where the active parameters cannot take one multi-tensor step.
  void check_one_launch(const char* who) const;
  std::vector<Tensor> params_;
  double lr_;
  GradBuckets buckets_;
  Tensor skip_if_;  // step_unless's flag while its step() runs

 private:
  Tensor lr_dev_;
  double lr_dev_value_ = 0;  // what lr_dev_ holds, once defined
  std::unique_ptr<StagedUpload> lr_upload_;
};

struct SgdOptions {
  double momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr, SgdOptions o = {});
  void step() override;
  void check_replayable() const override;
  bool ready_to_capture() const override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& sd) override;
  SgdOptions options;

 private:
  std::vector<Tensor> momentum_;  // undefined until a parameter's first step
  bool last_host_lr_ = false;  // the last step() launched the learning rate from the host
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, double lr, AdamWOptions o = {});
  void step() override;
  void check_replayable() const override;
  bool ready_to_capture() const override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& sd) override;
  AdamWOptions options;

 private:
  bool last_host_counts_ = false;  // the last step() bias-corrected from host counts
  std::vector<Tensor> m_, v_;
  // Per parameter, its count of steps (a frozen parameter's does not advance): on the
  // parameters' device once a multi-tensor step has taken it (step_dev_, f64 [1], which
  // adamw_step_multi advances, or not where loss scaling skips the step), else on the host
  // (steps_: before, after a load, on the per-parameter path).
  std::vector<int64_t> steps_;
  std::vector<Tensor> step_dev_;
  int64_t count(size_t i) const;  // the parameter's count, wherever it is (a read on a GPU)
};

// The same for any parameters, one reduction per parameter (Optimizer::clip_grad_norm
// works on its buckets).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace eg::optim
