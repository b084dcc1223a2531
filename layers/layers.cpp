#include "layers/layers.h"

#include <cmath>

namespace eg::nn {

namespace {
Tensor uniform_init(const Shape& s, double bound, Generator& g) { return Tensor::uniform(s, -bound, bound, g); }
}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, Conv2dOptions o, Generator& g)
    : in_channels(in), out_channels(out), kernel_size(k) {
  EG_CHECK(in > 0 && out > 0 && k > 0 && o.groups > 0 && in % o.groups == 0 && out % o.groups == 0, "Conv2d(", in, ", ",
           out, ", kernel ", k, ", groups ", o.groups, "): channel counts must be positive and divisible by groups");
  params = {o.stride, o.stride, o.padding, o.padding, o.dilation, o.dilation, o.groups};
  double fan_in = double(in / o.groups * k * k);
  weight = register_parameter("weight", uniform_init({out, in / o.groups, k, k}, 1.0 / std::sqrt(fan_in), g));
  if (o.bias) bias = register_parameter("bias", uniform_init({out}, 1.0 / std::sqrt(fan_in), g));
}

Tensor Conv2d::forward(const Tensor& x) {
  EG_CHECK(x.dim() == 4 && x.size(1) == in_channels, "Conv2d(", in_channels, " -> ", out_channels,
           "): expected input [N, ", in_channels, ", H, W], got ", shape_str(x.shape()));
  if (forward_override) return forward_override(x);
  if (is_training()) check_registered(weight, "weight"), check_registered(bias, "bias");
  return fn::conv2d(x, weight, bias, params);
}

double Conv2d::flops_per_sample(int64_t h, int64_t w) const {
  Shape o = ops::conv2d_out_shape({1, in_channels, h, w}, weight.shape(), params);
  return 2.0 * double(o[1] * o[2] * o[3]) * double(in_channels / params.groups * kernel_size * kernel_size);
}

BatchNorm2d::BatchNorm2d(int64_t c, double eps, double momentum) : eps(eps), momentum(momentum) {
  EG_CHECK(c > 0, "BatchNorm2d: channel count must be positive, got ", c);
  weight = register_parameter("weight", Tensor::ones({c}));
  bias = register_parameter("bias", Tensor::zeros({c}));
  running_mean = register_buffer("running_mean", Tensor::zeros({c}));
  running_var = register_buffer("running_var", Tensor::ones({c}));
}

Tensor BatchNorm2d::forward(const Tensor& x) { return forward(x, fused_act); }

std::string BatchNorm2d::type_name() const {
  switch (fused_act) {
    case ops::BnAct::relu: return "BatchNorm2d+ReLU";
    case ops::BnAct::relu6: return "BatchNorm2d+ReLU6";
    case ops::BnAct::none: break;
  }
  return "BatchNorm2d";
}

Tensor BatchNorm2d::forward(const Tensor& x, ops::BnAct act, const Tensor& residual) {
  EG_CHECK(x.dim() == 4 && x.size(1) == weight.size(0), "BatchNorm2d(", weight.size(0), "): expected input [N, ",
           weight.size(0), ", H, W], got ", shape_str(x.shape()));
  if (folded) {
    const Tensor h = residual.defined() ? fn::add(x, residual) : x;
    return act == ops::BnAct::none ? h : fn::activation(h, ops::unfused(act));
  }
  if (is_training()) check_registered(weight, "weight"), check_registered(bias, "bias");
  if (eval_batch_stats && !is_training())  // the statistics passed are copies: nothing updates the module's
    return fn::batch_norm(x, weight, bias, running_mean.clone(), running_var.clone(), true, 0.0, eps, act, residual);
  // See Note [Frozen BatchNorm semantics] and Note [Settling a frozen BatchNorm].
  if (is_training() && is_frozen() && !frozen_batch_stats && settling >= 0) {
    const double average = 1.0 / double(++settling);
    return fn::batch_norm(x, weight, bias, running_mean, running_var, true, average, eps, act, residual);
  }
  bool batch_stats = is_training() && (!is_frozen() || frozen_batch_stats);
  return fn::batch_norm(x, weight, bias, running_mean, running_var, batch_stats, momentum, eps, act, residual);
}

Linear::Linear(int64_t in, int64_t out, bool b, Generator& g) : in_features(in), out_features(out) {
  EG_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  weight = register_parameter("weight", uniform_init({out, in}, 1.0 / std::sqrt(double(in)), g));
  if (b) bias = register_parameter("bias", uniform_init({out}, 1.0 / std::sqrt(double(in)), g));
}

Tensor Linear::forward(const Tensor& x) {
  if (forward_override) return forward_override(x);
  if (is_training()) check_registered(weight, "weight"), check_registered(bias, "bias");
  return fn::linear(x, weight, bias);
}

std::string Activation::type_name() const {
  switch (act) {
    case ops::Act::relu: return "ReLU";
    case ops::Act::relu6: return "ReLU6";
    case ops::Act::gelu: return "GELU";
  }
  return "Activation";
}

std::shared_ptr<Pool2d> MaxPool2d(int64_t k, int64_t s, int64_t p) {
  return std::make_shared<Pool2d>(ops::Pool2dParams{ops::PoolKind::max, k, k, s, s, p, p, false});
}
std::shared_ptr<Pool2d> AvgPool2d(int64_t k, int64_t s, int64_t p) {
  return std::make_shared<Pool2d>(ops::Pool2dParams{ops::PoolKind::avg, k, k, s, s, p, p, false});
}

Tensor Dropout::forward(const Tensor& x) {
  const bool draws = is_training() && !is_frozen() && p > 0;
  if (!draws) return fn::dropout(x, p, false, default_generator());  // draws nothing
  EG_CHECK(!gen_lifetime_.expired(), "Dropout(p=", p, "): the Generator it was built with (nn::Dropout's, or the one ",
           "given to models::build_model) has been destroyed; keep it alive while the model trains, or build with ",
           "default_generator()");
  return fn::dropout(x, p, true, *gen_);
}

Embedding::Embedding(int64_t num, int64_t dim, Generator& g) {
  EG_CHECK(num > 0 && dim > 0, "Embedding(", num, ", ", dim, "): sizes must be positive");
  weight = register_parameter("weight", Tensor::randn({num, dim}, g));
}

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", Tensor::ones({dim}));
  bias = register_parameter("bias", Tensor::zeros({dim}));
}

}  // namespace eg::nn
