// Differentiable conv2d, batch norm, activations and pooling.
#include <cmath>
#include <tuple>

#include "autograd/autocast.h"
#include "autograd/check.h"
#include "autograd/functions.h"

namespace eg::fn {

using namespace detail;
using autograd::Node;
using autograd::Tensors;

namespace {

// Both convolutions' backward: x and w as the forward ran them, wt the weight
// gradient's dtype. Gradients are added into their destinations where there are any:
// the input's (a residual block's input, its shortcut's term already there) and the
// weight's and bias's (.grad in an optimizer bucket) together.
Tensors conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w, DType wt, const ops::Conv2dParams& p,
                        bool has_bias, const Node& n) {
  Tensor dx, dw, db;
  if (n.needs_input_grad(0)) {
    dx = destination_for(n, 0, x.shape(), x.dtype(), x.device());
    const bool into = dx.defined();
    if (!into) dx = empty_like(x);
    ops::call(ops::conv2d_bwd_data, dy, w, dx, p, into);
  }
  // See Note [Frozen layers skip weight gradients] in layers/module.h.
  const bool want_w = n.needs_input_grad(1), want_b = has_bias && n.needs_input_grad(2);
  if (!want_w && !want_b) return Tensors{dx, dw, db};
  bool into = false;
  std::tie(dw, db) = param_grads(n, 1, want_w, w.shape(), 2, want_b, {w.size(0)}, wt, w.device(), into);
  ops::call(ops::conv2d_bwd_weight, dy, x, dw, db, p, into);
  return Tensors{dx, dw, db};
}

// Under autocast (Note [Autocast]): x and the weight's cached copy in the scope's dtype,
// the output in it too, dw and db in the parameters' dtype.
Tensor conv2d_autocast(const Tensor& x_in, const Tensor& w, const Tensor& bias, const ops::Conv2dParams& p, DType low) {
  const Tensor x = cast(x_in, low), wl = autograd::autocast_weight(w);
  Tensor y = Tensor::empty(ops::conv2d_out_shape(x.shape(), w.shape(), p), low, x.device());
  ops::call(ops::conv2d_fwd, x, wl, bias, y, p);
  autograd::record_function(
      "Conv2dBackward", {x, w, bias}, {&y}, {x, wl},
      [p, has_bias = bias.defined(), wt = w.dtype()](const Tensors& g, const Tensors& s, const Node& n) {
    return conv2d_backward(g[0], s[0], s[1], wt, p, has_bias, n);
      });
  return y;
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w, const Tensor& bias, const ops::Conv2dParams& p) {
  check_dim(x_in, 4, "conv2d", "input");
  check_dim(w, 4, "conv2d", "weight");
  check_float(w, "conv2d", "weight");
  // A 16-bit input outside autocast (or under an f32 one) computes in the weight's dtype.
  const DType low = autograd::autocast_dtype();
  const Tensor x = low == DType::f32 && is_half(x_in.dtype()) ? cast(x_in, w.dtype()) : x_in;
  if (low == DType::f32) check_float(x, "conv2d", "input");
  check_same(w, bias, "conv2d", "bias");
  EG_CHECK(x.device() == w.device(), "conv2d: weight is on ", w.device().str(), " but the input is on ",
           x.device().str());
  EG_CHECK(p.groups >= 1 && x.size(1) == w.size(1) * p.groups, "conv2d: input has ", x.size(1),
           " channels but the weight expects ", w.size(1) * p.groups, " (", w.size(1), " per group x ", p.groups,
           " groups)");
  EG_CHECK(w.size(0) % p.groups == 0, "conv2d: ", w.size(0), " output channels do not split into ", p.groups,
           " groups");
  if (bias.defined())
    EG_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), "conv2d: bias must be [", w.size(0), "], got ",
             shape_str(bias.shape()));
  if (low != DType::f32) return conv2d_autocast(x, w, bias, p, low);
  check_same(x, w, "conv2d", "weight");
  Tensor y = empty_as(x, ops::conv2d_out_shape(x.shape(), w.shape(), p));
  ops::call(ops::conv2d_fwd, x, w, bias, y, p);
  autograd::record_function("Conv2dBackward", {x, w, bias}, {&y}, {x, w},
                            [p, has_bias = bias.defined()](const Tensors& g, const Tensors& s, const Node& n) {
    return conv2d_backward(g[0], s[0], s[1], s[1].dtype(), p, has_bias, n);
  });
  return y;
}

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor running_mean, Tensor running_var,
                  bool training, double momentum, double eps, ops::BnAct act, const Tensor& residual_in) {
  check_dim(x, 4, "batch_norm", "input");
  // 16-bit activations with f32 parameters and statistics (Note [Autocast]).
  const bool half = is_half(x.dtype());
  if (!half) check_float(x, "batch_norm", "input");
  const Tensor& params = gamma;  // their dtype: the statistics' and the parameter gradients'
  check_defined(gamma, "batch_norm", "a parameter or running statistic");
  EG_CHECK(gamma.device() == x.device(), "batch_norm: the parameters are on ", gamma.device().str(),
           " but the input is on ", x.device().str());
  const int64_t c = x.size(1);
  // A residual of the other width (an f32 shortcut beside 16-bit activations) joins x's.
  const bool other =
      residual_in.defined() && residual_in.dtype() != x.dtype() && (half || is_half(residual_in.dtype()));
  const Tensor residual = other ? cast(residual_in, x.dtype()) : residual_in;
  if (residual.defined()) {
    check_same(x, residual, "batch_norm", "residual");
    EG_CHECK(residual.shape() == x.shape(), "batch_norm: the residual has shape ", shape_str(residual.shape()),
             ", the input ", shape_str(x.shape()), "; they must match");
  }
  for (const Tensor* t : std::initializer_list<const Tensor*>{&gamma, &beta, &running_mean, &running_var}) {
    check_defined(*t, "batch_norm", "a parameter or running statistic");
    check_same(half ? params : x, *t, "batch_norm", "a parameter or running statistic");
    EG_CHECK(!half || t->dtype() == DType::f32, "batch_norm: a ", dtype_name(x.dtype()),
             " input needs f32 parameters and statistics, got ", dtype_name(t->dtype()));
    EG_CHECK(t->numel() == c, "batch_norm: input has ", c, " channels but a parameter has shape ",
             shape_str(t->shape()));
  }
  Tensor y = empty_like(x);
  Tensor mean, invstd;
  if (training) {
    EG_CHECK(x.numel() / c > 1, "batch_norm: training needs more than one value per channel, input ",
             shape_str(x.shape()));
    mean = empty_as(params, {c});
    invstd = empty_as(params, {c});
    ops::call(ops::batchnorm_fwd_train, x, gamma, beta, y, mean, invstd, running_mean, running_var, momentum, eps, act,
              residual);
  } else {
    ops::call(ops::batchnorm_fwd_infer, x, gamma, beta, running_mean, running_var, y, eps, act, residual);
    if (autograd::needs_record({x, gamma, beta})) {
      // Constants of the inference transform: the running statistics. Computed on the
      // host (a [C] vector) only when a backward will need them.
      mean = running_mean.clone();
      Tensor v = running_var.to(Device::cpu()).to(DType::f64);
      for (int64_t i = 0; i < c; ++i) v.data<double>()[i] = 1.0 / std::sqrt(v.data<double>()[i] + eps);
      invstd = v.to(params.dtype()).to(x.device());
    }
  }
  // With a fused activation the backward also needs y (its mask), saved detached: a node
  // holding its own output with history would be a reference cycle.
  Tensors inputs{x, gamma, beta};
  if (residual.defined()) inputs.push_back(residual);
  if (!autograd::needs_record(inputs)) return y;
  static const char* const names[2][3] = {
      {"BatchNormBackward", "BatchNormReluBackward", "BatchNormRelu6Backward"},
      {"BatchNormAddBackward", "BatchNormAddReluBackward", "BatchNormAddRelu6Backward"}};
  const bool fused = act != ops::BnAct::none;
  autograd::record_function(names[residual.defined()][int(act)], inputs, {&y},
                            {x, gamma, mean, invstd, fused ? y.detach() : Tensor()},
                            [training, act](const Tensors& g, const Tensors& s, const Node& n) {
    Tensor dx, dg, db, dr;
    if (n.needs_input_grad(0)) dx = empty_like(s[0]);
    bool into = false;  // gamma's and beta's gradients added into their .grad
    std::tie(dg, db) = param_grads(n, 1, n.needs_input_grad(1), s[1].shape(), 2, n.needs_input_grad(2), s[1].shape(),
                                   s[1].dtype(), s[1].device(), into);
    // The residual's gradient: dy itself without an activation,
    // the masked dy (written by the kernel) with one.
    const bool res = n.needs_input_grad(3);  // false without a residual
    if (res && s[4].defined()) dr = empty_like(g[0]);
    ops::call(ops::batchnorm_bwd, g[0], s[0], s[1], s[2], s[3], dx, dg, db, training, act, s[4], dr, into);
    if (res && !s[4].defined()) dr = g[0];
    return res ? Tensors{dx, dg, db, dr} : Tensors{dx, dg, db};
  });
  return y;
}

Tensor activation(const Tensor& x, ops::Act act) {
  check_defined(x, "activation", "input");
  if (!is_half(x.dtype())) check_float(x, "activation", "input");
  Tensor y = empty_like(x);
  ops::call(ops::act_fwd, act, x, y);
  autograd::record_function("ActivationBackward", {x}, {&y}, {x},
                            [act](const Tensors& g, const Tensors& s, const Node&) {
    Tensor dx = empty_like(s[0]);
    ops::call(ops::act_bwd, act, g[0], s[0], dx);
    return Tensors{dx};
  });
  return y;
}

Tensor pool2d(const Tensor& x_in, const ops::Pool2dParams& p) {
  check_dim(x_in, 4, "pool2d", "input");
  // Pooling takes a 16-bit input as it comes (Note [Autocast]).
  const Tensor x = is_half(x_in.dtype()) ? x_in : f32_input(x_in, "pool2d", "input");
  EG_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0,
           "pool2d: kernel and stride must be positive");
  EG_CHECK(p.pad_h * 2 <= p.kernel_h && p.pad_w * 2 <= p.kernel_w, "pool2d: padding must be at most half the kernel");
  Shape os = ops::pool2d_out_shape(x.shape(), p);
  EG_CHECK(os[2] > 0 && os[3] > 0, "pool2d: input ", shape_str(x.shape()), " is smaller than the kernel");
  Tensor y = empty_as(x, os), idx;
  if (p.kind == ops::PoolKind::max) idx = Tensor::empty(os, DType::s32, x.device());
  ops::call(ops::pool2d_fwd, x, y, idx, p);
  autograd::record_function("Pool2dBackward", {x}, {&y}, {idx},
                            [p, xs = x.shape()](const Tensors& g, const Tensors& s, const Node&) {
    Tensor dx = empty_as(g[0], xs);
    ops::call(ops::pool2d_bwd, g[0], s[0], dx, p);
    return Tensors{dx};
  });
  return y;
}

Tensor global_avg_pool(const Tensor& x_in) {
  check_dim(x_in, 4, "global_avg_pool", "input");
  const Tensor x = is_half(x_in.dtype()) ? x_in : f32_input(x_in, "global_avg_pool", "input");
  Tensor y = empty_as(x, {x.size(0), x.size(1)});
  ops::call(ops::global_avgpool_fwd, x, y);
  autograd::record_function("GlobalAvgPoolBackward", {x}, {&y}, {},
                            [xs = x.shape()](const Tensors& g, const Tensors&, const Node&) {
    Tensor dx = empty_as(g[0], xs);
    ops::call(ops::global_avgpool_bwd, g[0], dx);
    return Tensors{dx};
  });
  return y;
}

}  // namespace eg::fn
