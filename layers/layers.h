// The standard layers. Constructors initialise parameters as PyTorch does (Kaiming
// uniform with a = sqrt(5) for weights, uniform(+-1/sqrt(fan_in)) for biases) from
// the generator given, or eg::default_generator().
#pragma once
#include <functional>

#include "core/rng.h"
#include "layers/module.h"

namespace eg::nn {

struct Conv2dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions o = {}, Generator& g = default_generator());
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  Tensor weight, bias;  // bias undefined when disabled
  ops::Conv2dParams params;
  int64_t in_channels, out_channels, kernel_size;
  // Forward FLOPs per sample for an input of spatial size h x w (multiply-add = 2).
  double flops_per_sample(int64_t h, int64_t w) const;
  // Replaces forward() on an inference copy of a model: the int8 reference model
  // (quant/) runs its convolutions this way. Empty on any model that trains.
  std::function<Tensor(const Tensor&)> forward_override;
};

// Note [Frozen BatchNorm semantics]
// A frozen BatchNorm (the layer's default) behaves as in eval mode whatever train() says: it normalises
// with its running statistics and leaves them untouched. Updating running statistics
// of a frozen layer would silently change what the frozen prefix computes (and would
// invalidate cached activations), and its gamma/beta no longer adapt to batch
// statistics anyway. Unfreezing restores batch statistics in training mode.
// With frozen_batch_stats a frozen BatchNorm instead keeps training mode's batch
// statistics and updates its running statistics, as a PyTorch layer frozen with
// requires_grad_(False) alone does: no gradient flows, but the prefix's output keeps
// the normalisation the layers after it were trained on. The trainer sets it for
// every BatchNorm (--freeze-bn batch, its default): without an activation cache,
// which needs the prefix to compute a fixed function (--freeze-bn running, the
// paper's §4.3), nothing needs eval mode, and switching a prefix to its running
// statistics at the moment it freezes cost accuracy in the one run that shows it.
// Measurements: docs/freezing-measurements.md, "Frozen BatchNorm semantics".
//
// Note [Settling a frozen BatchNorm]
// A BatchNorm frozen on running statistics (--freeze-bn running) normalises with what its
// exponential average holds at the freeze: mostly the last ten or twenty batches'
// statistics, taken under weights that were still moving, so the frozen prefix computes
// a function its own weights never did. While `settling` >= 0 a frozen BatchNorm in
// training mode still normalises with each batch's statistics and sets its running
// statistics to the plain average of the batches it has seen since the freeze (`settling`
// counts them): their population statistics at the frozen weights ("precise BN"). The
// trainer ends settling after --freeze-bn-settle steps, and the prefix is a fixed function
// (and the activation cache stores it) from then on.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;  // forward(x, fused_act)
  // act: relu(bn(x)) or relu6(bn(x)); residual: bn(x) + residual (then the activation),
  // fused (fn::batch_norm).
  Tensor forward(const Tensor& x, ops::BnAct act, const Tensor& residual = Tensor());
  std::string type_name() const override;
  Tensor weight, bias, running_mean, running_var;
  double eps, momentum;
  // The activation after it, in its pass (conv -> BN -> ReLU or ReLU6): forward(x) is
  // act(bn(x)), with neither a pass of its own nor the activation's input kept for the
  // backward.
  ops::BnAct fused_act = ops::BnAct::none;
  // True once folded into the convolution before it (quant/): forward returns x.
  bool folded = false;
  bool frozen_batch_stats = false;  // see the Note
  int64_t settling = -1;  // see Note [Settling a frozen BatchNorm]
  // An inference copy (eval mode) that still normalises each batch with that batch's own
  // statistics, as training mode does, leaving its running statistics untouched: the
  // reference model of --freeze-reference-bn batch (Note [The reference's batch norm]
  // in quant/reference.h). Such a batch norm is never folded.
  bool eval_batch_stats = false;
};

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, Generator& g = default_generator());
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  Tensor weight, bias;
  int64_t in_features, out_features;
  // As Conv2d::forward_override: the int8 reference model's dynamically quantised
  // matmul (quant/int8.h, LinearInt8). Empty on any model that trains.
  std::function<Tensor(const Tensor&)> forward_override;
};

class Activation : public Module {
 public:
  explicit Activation(ops::Act a) : act(a) {}
  Tensor forward(const Tensor& x) override { return fn::activation(x, act); }
  std::string type_name() const override;
  ops::Act act;
};
inline std::shared_ptr<Activation> ReLU() { return std::make_shared<Activation>(ops::Act::relu); }
inline std::shared_ptr<Activation> ReLU6() { return std::make_shared<Activation>(ops::Act::relu6); }
inline std::shared_ptr<Activation> GELU() { return std::make_shared<Activation>(ops::Act::gelu); }

class Pool2d : public Module {
 public:
  explicit Pool2d(ops::Pool2dParams p) : params(p) {}
  Tensor forward(const Tensor& x) override { return fn::pool2d(x, params); }
  std::string type_name() const override { return params.kind == ops::PoolKind::max ? "MaxPool2d" : "AvgPool2d"; }
  ops::Pool2dParams params;
};
std::shared_ptr<Pool2d> MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0);
std::shared_ptr<Pool2d> AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0);

class GlobalAvgPool : public Module {  // [N, C, H, W] -> [N, C]
 public:
  Tensor forward(const Tensor& x) override { return fn::global_avg_pool(x); }
  std::string type_name() const override { return "GlobalAvgPool"; }
};

class Flatten : public Module {  // [N, ...] -> [N, prod(...)]
 public:
  Tensor forward(const Tensor& x) override { return fn::reshape(x, {x.size(0), -1}); }
  std::string type_name() const override { return "Flatten"; }
};

// Draws its masks from `g`, which it does not own: g must outlive the training of the
// module (the process-wide generator by default). A training forward after g is gone is
// an error that says so, not a read of freed memory.
class Dropout : public Module {
 public:
  explicit Dropout(double p, Generator& g = default_generator()) : p(p), gen_(&g), gen_lifetime_(g.lifetime()) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  // The generator it draws from (compared, not read: it may be gone).
  const Generator* draws_from() const { return gen_; }
  double p;

 private:
  Generator* gen_;
  std::weak_ptr<const void> gen_lifetime_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Generator& g = default_generator());  // N(0, 1) init
  Tensor forward(const Tensor& ids) override {
    if (is_training()) check_registered(weight, "weight");
    return fn::embedding(ids, weight);
  }
  std::string type_name() const override { return "Embedding"; }
  Tensor weight;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override {
    if (is_training()) check_registered(weight, "weight"), check_registered(bias, "bias");
    return fn::layer_norm(x, weight, bias, eps);
  }
  std::string type_name() const override { return "LayerNorm"; }
  Tensor weight, bias;
  double eps;
};

// Mean cross-entropy over the batch, with label smoothing and an ignored index.
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(double label_smoothing = 0.0, int64_t ignore_index = -100)
      : label_smoothing(label_smoothing), ignore_index(ignore_index) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return fn::cross_entropy(logits, target, label_smoothing, ignore_index);
  }
  double label_smoothing;
  int64_t ignore_index;
};

}  // namespace eg::nn
