// Op cases: 2-D convolution (forward, backward-data, backward-weight with bias grad).
// Small gradchecked cases cover stride, padding, dilation, groups (depthwise too),
// rectangular kernels and bias; bench cases are ResNet-56's three 3x3 layers, its
// stride-2 transition and its stem (3 -> 16 channels) at batch 128. Most have a bf16
// twin (autocast's dtypes: bf16 activations and weights, f32 bias and weight gradient).
#include <cmath>

#include "tests/op_cases.h"

namespace eg::testing {
namespace {

struct ConvSpec {
  std::string variant;
  Shape x, w;  // [N, C, H, W], [K, C/groups, R, S]
  ops::Conv2dParams p;
  bool bias = false;
  bool big = false;
  bool want_dw = true;  // false: dw undefined (frozen weight), db still computed when biased
  bool accumulate = false;  // the backward adds into gradients already holding values
  bool offset_params = false;  // dw and db views one element into their buffers, as in a gradient bucket
};

ops::Conv2dParams params(int64_t stride, int64_t pad, int64_t dil = 1, int64_t groups = 1) {
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dil_h = p.dil_w = dil;
  p.groups = groups;
  return p;
}

void add_conv(std::vector<OpCase>& v, const ConvSpec& s) {
  OpCase c;
  c.name = "conv2d/" + s.variant;
  // Weights scaled by 1/sqrt(fan_in) (as initialisers do), so outputs are O(1).
  const double wscale = 1.0 / std::sqrt(double(s.w[1] * s.w[2] * s.w[3]));
  c.make_inputs = [s, wscale](DType dt) {
    Tensors in{randn(s.x, dt, 31), randn(s.w, dt, 32, wscale), Tensor()};
    if (s.bias) in[2] = randn({s.w[0]}, param_dtype(dt), 33);
    return in;
  };
  c.forward = [p = s.p](ops::Backend b, const Tensors& in) {
    Tensor y = empty_on(in[0], ops::conv2d_out_shape(in[0].shape(), in[1].shape(), p), in[0].dtype());
    ops::run(ops::conv2d_fwd, b, in[0], in[1], in[2], y, p);
    return Tensors{y};
  };
  c.backward = [p = s.p, want_dw = s.want_dw, acc = s.accumulate, off = s.offset_params](
                   ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    // Accumulating, each gradient starts from values of its own (in its tensor's layout,
    // where the backend writes that layout).
    auto start = [acc, b](const Tensor& like, DType dt, uint64_t seed) {
      const Tensor t = gradient_start(like, like.shape(), dt, acc, seed);
      return acc && like.is_blocked() && b != ops::Backend::ref ? t.to_format(like.format()) : t;
    };
    // A parameter's gradient, offset: a view starting one element into a larger buffer.
    auto param = [&](const Tensor& like, DType dt, uint64_t seed) {
      if (!off) return start(like, dt, seed);
      Tensor buf = gradient_start(like, {like.numel() + 1}, dt, acc, seed);
      return buf.slice(1, like.numel() + 1).reshape(like.shape());
    };
    Tensor dx = start(in[0], in[0].dtype(), 41), dw, db;
    ops::run(ops::conv2d_bwd_data, b, dout[0], in[1], dx, p, acc);
    if (want_dw) dw = param(in[1], param_dtype(in[1].dtype()), 42);
    if (in[2].defined()) db = param(in[2], in[2].dtype(), 43);
    ops::run(ops::conv2d_bwd_weight, b, dout[0], in[0], dw, db, p, acc);
    return Tensors{dx, dw, db};
  };
  c.uses = {uses(ops::conv2d_fwd), uses(ops::conv2d_bwd_data), uses(ops::conv2d_bwd_weight)};
  c.gradcheck = !s.big && !s.accumulate;
  c.accumulates = s.accumulate;
  c.bench = s.big;
  c.bench_backward = true;
  if (s.big) {
    const Shape y = ops::conv2d_out_shape(s.x, s.w, s.p);
    c.flops = 3 * 2.0 * double(y[0] * y[1] * y[2] * y[3]) * double(s.w[1] * s.w[2] * s.w[3]);
    // Forward and input gradient reduce over C*R*S (or K*R*S) <= 576 products of O(1)
    // (worst error seen ~5e-6). The weight gradient reduces over N*P*Q (131072 for the
    // 32x32 layer) products of unit normals, so |dw| ~ sqrt(N*P*Q) and oneDNN's float
    // accumulation errs by ~3e-5 of that scale (ref sums in double): atol is 1e-4 of it.
    c.fwd_tol = {2e-5, 1e-4};
    c.bwd_tol = {1e-4 * std::sqrt(double(y[0] * y[2] * y[3])), 1e-4};
  }
  v.push_back(c);
}

// The case and its bf16 twin (Note [bf16 kernels]): x, w, y, dy and dx bf16; bias, dw
// and db f32, as autocast keeps them.
void add_conv_and_bf16(std::vector<OpCase>& v, const ConvSpec& s) {
  add_conv(v, s);
  add_bf16_twin(v);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  add_conv_and_bf16(v, {"3x3_pad1_bias", {2, 3, 5, 5}, {4, 3, 3, 3}, params(1, 1), true});
  add_conv_and_bf16(v, {"3x3_stride2", {2, 3, 7, 7}, {4, 3, 3, 3}, params(2, 1)});
  add_conv_and_bf16(v, {"3x3_dil2", {2, 3, 6, 6}, {4, 3, 3, 3}, params(1, 2, 2)});
  add_conv_and_bf16(v, {"groups3", {2, 6, 5, 5}, {6, 2, 3, 3}, params(1, 1, 1, 3), true});
  add_conv_and_bf16(v, {"depthwise_stride2_bias", {2, 4, 6, 6}, {4, 1, 3, 3}, params(2, 1, 1, 4), true});
  // Unbiased grouped ones, as MobileNetV2's: 16-bit ones run NHWC on CUDA under
  // EG_CUDA_GROUPED_NHWC=1 (kernels/cuda/conv2d.cu), NCHW otherwise.
  add_conv_and_bf16(v, {"depthwise_3x3", {2, 8, 6, 6}, {8, 1, 3, 3}, params(1, 1, 1, 8)});
  add_nhwc_twin(v, {0}, true);
  add_conv_and_bf16(v, {"depthwise_stride2", {2, 8, 7, 7}, {8, 1, 3, 3}, params(2, 1, 1, 8)});
  add_conv_and_bf16(v, {"groups2", {2, 8, 5, 5}, {6, 4, 3, 3}, params(1, 1, 1, 2)});
  add_conv_and_bf16(v, {"1x1_stride2", {2, 4, 6, 6}, {5, 4, 1, 1}, params(2, 0)});
  add_nhwc_twin(v, {0}, true);
  {
    ops::Conv2dParams p;  // rectangular everything: kernel 2x3, stride (1, 2), pad (0, 1), dilation (2, 1)
    p.stride_h = 1, p.stride_w = 2, p.pad_h = 0, p.pad_w = 1, p.dil_h = 2, p.dil_w = 1;
    add_conv_and_bf16(v, {"rect_2x3", {2, 2, 5, 7}, {3, 2, 2, 3}, p, true});
  }
  add_conv_and_bf16(v, {"frozen_weight_bias_grad", {2, 3, 5, 5}, {4, 3, 3, 3}, params(1, 1), true, false, false});
  // Gradients added into where they live (Note [Gradient destinations]): a biased conv
  // (dx, dw and db), one that runs NHWC on CUDA (cuDNN's blend into an NHWC dx; and into
  // a plain dx, which is computed and added), a blocked dx on the CPU.
  add_conv_and_bf16(v, {"3x3_pad1_bias_accumulate", {2, 3, 5, 5}, {4, 3, 3, 3}, params(1, 1), true, false, true, true});
  // Into .grad views at 4 bytes past an allocation's start (cuDNN blends only at 256: these are added by axpy).
  add_conv(v, {"3x3_pad1_bias_accumulate_offset", {2, 3, 5, 5}, {4, 3, 3, 3}, params(1, 1), true, false, true, true, true});
  add_conv_and_bf16(v, {"3x3_stride2_accumulate", {2, 8, 7, 7}, {8, 8, 3, 3}, params(2, 1), false, false, true, true});
  add_nhwc_twin(v, {0}, true);
  add_conv(v, {"c16_nchw16c_accumulate", {2, 16, 5, 6}, {32, 16, 3, 3}, params(1, 1), false, false, true, true});
  block_inputs(v.back(), {0}, true);
  // ResNet-56 (CIFAR, batch 128): the three stages' 3x3 convs and a stage transition.
  // Blocked activations in and out (Note [Blocked activations]); a 24-channel output
  // stays plain; a plain dy into a blocked x.
  add_conv(v, {"c16_nchw16c_bias", {2, 16, 5, 6}, {32, 16, 3, 3}, params(1, 1), true});
  block_inputs(v.back(), {0}, true);
  add_conv(v, {"c16_nchw16c_to_c24", {2, 16, 5, 5}, {24, 16, 3, 3}, params(2, 1)});
  block_inputs(v.back(), {0}, true);
  add_conv(v, {"c32_nchw16c_dy_plain_1x1", {2, 32, 4, 4}, {16, 32, 1, 1}, params(1, 0)});
  block_inputs(v.back(), {0}, false);
  add_conv(v, {"depthwise_c32_nchw16c", {2, 32, 6, 6}, {32, 1, 3, 3}, params(2, 1, 1, 32), true});
  block_inputs(v.back(), {0}, true);
  add_conv(v, {"resnet56_c16_32x32_nchw16c", {128, 16, 32, 32}, {16, 16, 3, 3}, params(1, 1), false, true});
  block_inputs(v.back(), {0}, true);
  add_conv_and_bf16(v, {"resnet56_c16_32x32", {128, 16, 32, 32}, {16, 16, 3, 3}, params(1, 1), false, true});
  add_nhwc_twin(v, {0}, true);  // x and dy NHWC, as a 16-bit network on CUDA hands them
  add_conv_and_bf16(v, {"resnet56_c32_16x16", {128, 32, 16, 16}, {32, 32, 3, 3}, params(1, 1), false, true});
  add_conv_and_bf16(v, {"resnet56_c64_8x8", {128, 64, 8, 8}, {64, 64, 3, 3}, params(1, 1), false, true});
  add_conv_and_bf16(v, {"resnet56_c16to32_stride2", {128, 16, 32, 32}, {32, 16, 3, 3}, params(2, 1), false, true});
  add_conv_and_bf16(v, {"resnet56_stem_c3to16", {128, 3, 32, 32}, {16, 3, 3, 3}, params(1, 1), false, true});
});

}  // namespace
}  // namespace eg::testing
