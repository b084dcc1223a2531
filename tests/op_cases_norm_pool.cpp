// Op cases: batch norm (training and inference forward, backward in both modes),
// max/avg pooling and global average pooling.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "tests/op_cases.h"

namespace eg::testing {
namespace {

// ---- batch norm

// Inputs: x (offset and scaled so the statistics matter), gamma, beta, running mean
// and running variance.
// Under bf16 activations the parameters and statistics are f32 (param_dtype).
Tensors bn_inputs(const Shape& s, DType dt) {
  Tensor x = randn(s, DType::f64, 41, 2.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] += 0.5;
  const int64_t c = s[1];
  const DType pt = param_dtype(dt);
  return {x.to(dt), uniform({c}, pt, 42, 0.5, 1.5), randn({c}, pt, 43), randn({c}, pt, 44, 0.3),
          uniform({c}, pt, 45, 0.5, 2.0)};
}

// A case's inputs: with a residual, a sixth input; with ReLU6, gamma in [2, 6] so that
// some outputs pass its 6.
Tensors bn_case_inputs(const Shape& s, DType dt, bool residual, ops::BnAct act) {
  Tensors in = bn_inputs(s, dt);
  if (act == ops::BnAct::relu6) in[1] = uniform({s[1]}, param_dtype(dt), 42, 2.0, 6.0);
  if (residual) in.push_back(randn(s, dt, 46));
  return in;
}

constexpr double kMomentum = 0.1, kEps = 1e-5;

// Training mode. Outputs: y, saved mean, saved invstd, updated running mean and
// variance (the running statistics are cloned first, so each call starts alike).
// want: which of dx, dgamma, dbeta the backward asks for.
// act: the fused activation (relu, relu6), whose backward takes y for the mask.
// residual: a sixth input r, y = act(bn(x) + r); the backward also gives dr.
// accumulate: dgamma and dbeta added into values already there (a parameter's .grad).
void add_bn_train(std::vector<OpCase>& v, const std::string& variant, Shape s, bool big, bool want_dx = true,
                  bool want_affine = true, ops::BnAct act = ops::BnAct::none, bool residual = false,
                  bool accumulate = false) {
  OpCase c;
  c.name = "batchnorm/train_" + variant;
  c.make_inputs = [s, residual, act](DType dt) { return bn_case_inputs(s, dt, residual, act); };
  c.forward = [act, residual](ops::Backend b, const Tensors& in) {
    const int64_t ch = in[0].size(1);
    Tensor y = empty_like(in[0]), mean = empty_on(in[0], {ch}, in[1].dtype());
    Tensor invstd = empty_on(in[0], {ch}, in[1].dtype());
    Tensor rm = in[3].clone(), rv = in[4].clone();
    ops::run(ops::batchnorm_fwd_train, b, in[0], in[1], in[2], y, mean, invstd, rm, rv, kMomentum, kEps, act,
             residual ? in[5] : Tensor());
    return Tensors{y, mean, invstd, rm, rv};
  };
  c.backward = [want_dx, want_affine, act, residual, accumulate](ops::Backend b, const Tensors& in, const Tensors& out,
                                                                 const Tensors& dout) {
    Tensor dx, dg, db, dr;
    if (want_dx) dx = empty_like(in[0]);
    if (want_affine)
      dg = gradient_start(in[1], in[1].shape(), in[1].dtype(), accumulate, 47),
      db = gradient_start(in[2], in[2].shape(), in[2].dtype(), accumulate, 48);
    if (residual) dr = empty_like(in[0]);
    ops::run(ops::batchnorm_bwd, b, dout[0], in[0], in[1], out[1], out[2], dx, dg, db, true, act,
             act != ops::BnAct::none ? out[0] : Tensor(), dr, accumulate);
    return residual ? Tensors{dx, dg, db, Tensor(), Tensor(), dr} : Tensors{dx, dg, db, Tensor(), Tensor()};
  };
  c.uses = {uses(ops::batchnorm_fwd_train), uses(ops::batchnorm_bwd)};
  c.gradcheck = !big && !accumulate;
  c.bench = big;
  c.bench_backward = true;
  // Minimal traffic: forward reads x (and r), writes y; backward reads dy, x (and y),
  // writes dx (and dr).
  c.bytes = double(shape_numel(s)) * 4 * (2 + 3 + (act != ops::BnAct::none ? 1 : 0) + (residual ? 2 : 0));
  // Statistics sum N*H*W values (float within a row, double across rows on the fast
  // path; double throughout in ref): worst errors seen ~1e-6 (y, dx), 2e-7 relative
  // (dgamma, dbeta).
  c.fwd_tol = c.bwd_tol = {5e-6, 2e-5};
  v.push_back(c);
}

// Inference mode: running statistics are constants, in both directions.
void add_bn_infer(std::vector<OpCase>& v, const std::string& variant, Shape s, bool big,
                  ops::BnAct act = ops::BnAct::none, bool residual = false, bool accumulate = false) {
  OpCase c;
  c.name = "batchnorm/infer_" + variant;
  c.make_inputs = [s, residual, act](DType dt) { return bn_case_inputs(s, dt, residual, act); };
  c.forward = [act, residual](ops::Backend b, const Tensors& in) {
    Tensor y = empty_like(in[0]);
    ops::run(ops::batchnorm_fwd_infer, b, in[0], in[1], in[2], in[3], in[4], y, kEps, act, residual ? in[5] : Tensor());
    return Tensors{y};
  };
  c.backward = [act, residual, accumulate](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    // invstd from the running variance, as autograd computes it (on the host).
    Tensor var = in[4].to(Device::cpu()).to(DType::f64).clone();
    for (int64_t i = 0; i < var.numel(); ++i) var.data<double>()[i] = 1.0 / std::sqrt(var.data<double>()[i] + kEps);
    Tensor invstd = var.to(in[4].dtype()).to(in[0].device());
    Tensor dx = empty_like(in[0]), dg = gradient_start(in[1], in[1].shape(), in[1].dtype(), accumulate, 47), db = gradient_start(in[2], in[2].shape(), in[2].dtype(), accumulate, 48), dr;
    if (residual) dr = empty_like(in[0]);
    ops::run(ops::batchnorm_bwd, b, dout[0], in[0], in[1], in[3], invstd, dx, dg, db, false, act,
             act != ops::BnAct::none ? out[0] : Tensor(), dr, accumulate);
    return residual ? Tensors{dx, dg, db, Tensor(), Tensor(), dr} : Tensors{dx, dg, db, Tensor(), Tensor()};
  };
  c.uses = {uses(ops::batchnorm_fwd_infer), uses(ops::batchnorm_bwd)};
  c.gradcheck = !big && !accumulate;
  c.bench = big;
  c.bytes = double(shape_numel(s)) * 4 * 2;
  c.fwd_tol = c.bwd_tol = {5e-6, 2e-5};
  v.push_back(c);
}

// ---- pooling

ops::Pool2dParams pool(ops::PoolKind kind, int64_t k, int64_t stride, int64_t pad, bool include_pad = false) {
  ops::Pool2dParams p;
  p.kind = kind;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.count_include_pad = include_pad;
  return p;
}

// Distinct values 0.01 apart in a random order: no ties in any window, and finite
// differences (h = 1e-6) never change an argmax.
Tensor distinct_values(const Shape& s, DType dt, uint64_t seed) {
  Tensor keys = randn(s, DType::f64, seed);
  std::vector<int64_t> order(size_t(keys.numel()));
  std::iota(order.begin(), order.end(), 0);
  const double* k = keys.data<double>();
  std::sort(order.begin(), order.end(), [k](int64_t a, int64_t b) { return k[a] < k[b]; });
  Tensor t = Tensor::empty(s, DType::f64);
  for (size_t r = 0; r < order.size(); ++r)
    t.data<double>()[order[r]] = 0.01 * (double(r) - 0.5 * double(order.size()));
  return t.to(dt);
}

void add_pool(std::vector<OpCase>& v, const std::string& variant, Shape s, ops::Pool2dParams p, bool big) {
  OpCase c;
  const bool is_max = p.kind == ops::PoolKind::max;
  c.name = std::string("pool2d/") + (is_max ? "max_" : "avg_") + variant;
  c.make_inputs = [s, is_max](DType dt) {
    // Max pooling: distinct values, so that no window holds a tie (which maximum a tie
    // routes the gradient to is each library's own choice; 6M normal f32 draws hold ties).
    return Tensors{is_max ? distinct_values(s, dt, 51) : randn(s, dt, 51)};
  };
  c.forward = [p, is_max](ops::Backend b, const Tensors& in) {
    const Shape os = ops::pool2d_out_shape(in[0].shape(), p);
    Tensor y = empty_on(in[0], os, in[0].dtype()), idx;
    if (is_max) idx = empty_on(in[0], os, DType::s32);
    ops::run(ops::pool2d_fwd, b, in[0], y, idx, p);
    return is_max ? Tensors{y, idx} : Tensors{y};
  };
  c.backward = [p, is_max](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    Tensor dx = empty_like(in[0]);
    ops::run(ops::pool2d_bwd, b, dout[0], is_max ? out[1] : Tensor(), dx, p);
    return Tensors{dx};
  };
  c.uses = {uses(ops::pool2d_fwd), uses(ops::pool2d_bwd)};
  // The max and its indices are exact; its gradient sums overlapping windows' shares in
  // an order that differs between backends (last-bit differences). Averages differ by
  // summation order only.
  if (is_max) c.fwd_tol = {0, 0}, c.bwd_tol = {1e-6, 1e-6};
  else c.fwd_tol = c.bwd_tol = {1e-6, 1e-5};
  c.gradcheck = !big;
  c.bench = big;
  c.bench_backward = true;
  const Shape os = ops::pool2d_out_shape(s, p);
  const double in_bytes = double(shape_numel(s)) * 4, out_bytes = double(shape_numel(os)) * 4;
  // Forward: read x, write y (and indices); backward: read dy (and indices), write dx.
  c.bytes = is_max ? 2 * in_bytes + 4 * out_bytes : 2 * in_bytes + 2 * out_bytes;
  v.push_back(c);
}

void add_global_avgpool(std::vector<OpCase>& v, const std::string& variant, Shape s, bool big) {
  OpCase c;
  c.name = "global_avgpool/" + variant;
  c.make_inputs = [s](DType dt) { return Tensors{randn(s, dt, 61)}; };
  c.forward = [](ops::Backend b, const Tensors& in) {
    Tensor y = empty_on(in[0], {in[0].size(0), in[0].size(1)}, in[0].dtype());
    ops::run(ops::global_avgpool_fwd, b, in[0], y);
    return Tensors{y};
  };
  c.backward = [](ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    Tensor dx = empty_like(in[0]);
    ops::run(ops::global_avgpool_bwd, b, dout[0], dx);
    return Tensors{dx};
  };
  c.uses = {uses(ops::global_avgpool_fwd), uses(ops::global_avgpool_bwd)};
  c.gradcheck = !big;
  c.bench = big;
  c.bench_backward = true;
  c.bytes = double(shape_numel(s)) * 4 * 2;
  c.fwd_tol = {1e-6, 1e-5};
  c.bwd_tol = {1e-7, 1e-6};
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  add_bn_train(v, "small", {4, 3, 4, 5}, false);
  add_bf16_twin(v);
  add_bn_train(v, "small_no_dx", {4, 3, 4, 5}, false, false, true);
  add_bf16_twin(v);
  add_bn_train(v, "small_dx_only", {3, 2, 5, 5}, false, true, false);
  add_bn_train(v, "resnet_128x16x32x32", {128, 16, 32, 32}, true);
  // nChw16c (Note [Blocked activations]): blocked x and dy, blocked x with plain dy,
  // no dx, inference.
  add_bn_train(v, "c32_nchw16c", {4, 32, 6, 5}, false);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_bn_train(v, "c32_nchw16c_dy_plain", {3, 32, 5, 3}, false);
  block_inputs(v.back(), {0}, false);
  add_bf16_twin(v);
  add_bn_train(v, "c16_nchw16c_no_dx", {4, 16, 4, 5}, false, false, true);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_bn_train(v, "resnet_128x16x32x32_nchw16c", {128, 16, 32, 32}, true);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_bn_infer(v, "c32_nchw16c", {4, 32, 6, 5}, false);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  // The fused ReLU, plain and blocked, training and inference.
  add_bn_train(v, "small_relu", {4, 3, 4, 5}, false, true, true, ops::BnAct::relu);
  add_bf16_twin(v);
  add_bn_train(v, "c32_nchw16c_relu", {4, 32, 6, 5}, false, true, true, ops::BnAct::relu);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_bn_train(v, "c16_nchw16c_relu_dy_plain_no_dx", {3, 16, 5, 3}, false, false, true, ops::BnAct::relu);
  block_inputs(v.back(), {0}, false);
  add_bf16_twin(v);
  add_bn_train(v, "resnet_128x16x32x32_nchw16c_relu", {128, 16, 32, 32}, true, true, true, ops::BnAct::relu);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  // The fused ReLU6 (MobileNetV2's conv -> BN -> ReLU6): plain (24 channels, which bf16
  // cannot block), blocked, NHWC, with a residual, in inference, and a MobileNetV2 shape.
  add_bn_train(v, "small_relu6", {4, 3, 4, 5}, false, true, true, ops::BnAct::relu6);
  add_bf16_twin(v);
  add_bn_train(v, "c24_relu6", {4, 24, 4, 6}, false, true, true, ops::BnAct::relu6);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);
  add_bn_train(v, "c32_nchw16c_relu6", {4, 32, 6, 5}, false, true, true, ops::BnAct::relu6);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_bn_train(v, "c32_nchw16c_add_relu6", {4, 32, 6, 5}, false, true, true, ops::BnAct::relu6, true);
  block_inputs(v.back(), {0, 5}, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0, 5}, true);
  add_bn_infer(v, "c32_nchw16c_relu6", {4, 32, 6, 5}, false, ops::BnAct::relu6);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_bn_train(v, "mobilenetv2_64x144x16x16_nchw16c_relu6", {64, 144, 16, 16}, true, true, true, ops::BnAct::relu6);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);
  // With a residual (a block's end): plain, blocked, mixed layouts, with and without ReLU.
  add_bn_train(v, "small_add_relu", {4, 3, 4, 5}, false, true, true, ops::BnAct::relu, true);
  add_bf16_twin(v);
  // Planes of whole vectors of 8 (CUDA's 16-bit kernels read vectors there, Note [Vector
  // loads]), a batch the slices split unevenly.
  add_bn_train(v, "hw24_add_relu", {5, 3, 4, 6}, false, true, true, ops::BnAct::relu, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0, 5}, true);  // 3 channels: NHWC rows of no whole vector
  add_bn_train(v, "small_add", {4, 3, 4, 5}, false, true, true, ops::BnAct::none, true);
  add_bn_train(v, "c32_nchw16c_add_relu", {4, 32, 6, 5}, false, true, true, ops::BnAct::relu, true);
  block_inputs(v.back(), {0, 5}, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0, 5}, true);
  add_nhwc_twin(v, {0}, false, "_nhwc_x_only");  // the residual and the output gradient plain
  add_bn_train(v, "c16_nchw16c_add_plain_residual_no_affine", {3, 16, 5, 3}, false, true, false, ops::BnAct::relu,
               true);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_bn_train(v, "c16_plain_add_nchw16c_residual_dy", {3, 16, 5, 3}, false, true, true, ops::BnAct::relu, true);
  block_inputs(v.back(), {5}, true);
  add_bf16_twin(v);
  add_bn_train(v, "c32_nchw16c_add", {4, 32, 6, 5}, false, true, true, ops::BnAct::none, true);
  block_inputs(v.back(), {0, 5}, false);
  add_bn_train(v, "resnet_128x16x32x32_nchw16c_add_relu", {128, 16, 32, 32}, true, true, true, ops::BnAct::relu, true);
  block_inputs(v.back(), {0, 5}, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0, 5}, true);
  add_bn_infer(v, "small_add_relu", {4, 3, 4, 5}, false, ops::BnAct::relu, true);
  add_bn_infer(v, "c32_nchw16c_add_relu", {4, 32, 6, 5}, false, ops::BnAct::relu, true);
  block_inputs(v.back(), {0, 5}, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0, 5}, true);
  add_bn_infer(v, "small_relu", {4, 3, 4, 5}, false, ops::BnAct::relu);
  add_bf16_twin(v);
  add_bn_infer(v, "c32_nchw16c_relu", {4, 32, 6, 5}, false, ops::BnAct::relu);
  block_inputs(v.back(), {0}, true);
  add_bn_infer(v, "small", {4, 3, 4, 5}, false);
  // dgamma and dbeta added into their .grad (Note [Gradient destinations]).
  add_bn_train(v, "small_relu_accumulate", {4, 3, 4, 5}, false, true, true, ops::BnAct::relu, false, true);
  add_bf16_twin(v);
  add_bn_train(v, "c32_nchw16c_add_relu_accumulate", {4, 32, 6, 5}, false, true, true, ops::BnAct::relu, true, true);
  block_inputs(v.back(), {0, 5}, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0, 5}, true);
  add_bn_infer(v, "small_accumulate", {4, 3, 4, 5}, false, ops::BnAct::none, false, true);
  add_bn_infer(v, "resnet_128x16x32x32", {128, 16, 32, 32}, true);

  using ops::PoolKind;
  add_pool(v, "3x3_s2_pad1", {2, 3, 7, 7}, pool(PoolKind::max, 3, 2, 1), false);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);  // 16-bit NHWC on CUDA, as a ResNet stem pools
  add_pool(v, "2x2_s2", {2, 3, 6, 6}, pool(PoolKind::max, 2, 2, 0), false);
  add_pool(v, "3x3_s1_pad1_rect", {2, 2, 5, 7}, pool(PoolKind::max, 3, 1, 1), false);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);
  add_pool(v, "3x3_s3_pad1", {2, 2, 7, 8}, pool(PoolKind::max, 3, 3, 1), false);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);
  {
    ops::Pool2dParams p = pool(PoolKind::max, 2, 1, 1);  // rectangular: kernel 2x3, stride 1x3, pad 1x1
    p.kernel_w = 3, p.stride_w = 3;
    add_pool(v, "k2x3_s1x3_pad1", {2, 2, 5, 9}, p, false);
    p.kind = PoolKind::avg;
    add_pool(v, "k2x3_s1x3_pad1", {2, 2, 5, 9}, p, false);
    p.count_include_pad = true;
    add_pool(v, "k2x3_s1x3_pad1_incl", {2, 2, 5, 9}, p, false);
    add_bf16_twin(v);
    add_nhwc_twin(v, {0}, true);
    // 8 channels: CUDA's NHWC max pooling takes them as one vector a thread.
    p.kind = PoolKind::max, p.count_include_pad = false;
    add_pool(v, "k2x3_s1x3_pad1_c8", {2, 8, 5, 9}, p, false);
    v.back().gradcheck = false;  // the 2-channel case's gradcheck covers the math
    add_bf16_twin(v);
    add_nhwc_twin(v, {0}, true);
  }
  add_pool(v, "3x3_s2_pad1_incl", {2, 3, 7, 7}, pool(PoolKind::avg, 3, 2, 1, true), false);
  add_pool(v, "3x3_s2_pad1_excl", {2, 3, 7, 7}, pool(PoolKind::avg, 3, 2, 1, false), false);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);
  add_pool(v, "2x2_s2", {2, 3, 6, 6}, pool(PoolKind::avg, 2, 2, 0), false);
  add_pool(v, "3x3_s2_pad1_c16", {2, 16, 9, 9}, pool(PoolKind::max, 3, 2, 1), false);
  v.back().gradcheck = false;  // the 3-channel cases' gradcheck covers the math
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);
  add_pool(v, "3x3_s2_pad1_32x64x56x56", {32, 64, 56, 56}, pool(PoolKind::max, 3, 2, 1), true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);  // benchmarked: the 16-bit NHWC pooling of a ResNet stem
  add_pool(v, "3x3_s2_pad1_32x64x56x56", {32, 64, 56, 56}, pool(PoolKind::avg, 3, 2, 1, false), true);
  add_pool(v, "2x2_s2_128x64x16x16", {128, 64, 16, 16}, pool(PoolKind::avg, 2, 2, 0), true);

  add_global_avgpool(v, "small", {2, 3, 4, 5}, false);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);
  add_global_avgpool(v, "resnet56_128x64x8x8", {128, 64, 8, 8}, true);
});

}  // namespace
}  // namespace eg::testing
