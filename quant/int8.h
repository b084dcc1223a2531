// int8 convolution for the reference model (Egeria §4.1): weights quantised per output
// channel to s8 (symmetric), activations per tensor to u8 (non-negative inputs, e.g.
// after a ReLU) or s8, products accumulated exactly in s32 by oneDNN's int8 primitives
// (VNNI where the CPU has it), then dequantised to f32 with the bias added:
//
//   y[n,k,p,q] = float(sum q_x * q_w[k]) * (1 / (s_x * s_w[k])) + bias[k]
//
// Note [Static activation scales]
// As the paper, a convolution's input scale is calibrated on a few batches and then
// fixed (static quantisation; --freeze-reference-calibration N, 3 by default): the
// first N inputs a convolution of a reference sees widen its observed range [lo, hi]
// (the running min/max, PyTorch's MinMaxObserver), each of them quantised with the
// range so far, which holds it; from then on the scale is fixed, and inputs beyond the
// range saturate. A reference is rebuilt from every new snapshot and calibrates
// afresh; its ranges are part of the freezing state that a checkpoint keeps
// (ReferenceModel::calibration), so a resumed run quantises as the uninterrupted one.
// With N = 0 every input is quantised with its own range instead (dynamic), at the
// cost of one more read of it; per-batch scales never go stale, but in SP-loss terms
// the two agree to within the bound of Note [int8 reference accuracy] (tests/test_quant.cpp).
// Linear layers are always dynamic, as PyTorch's quantize_dynamic for Transformers, with a
// scale per row (token): Note [Per-token activation scales].
//
// ConvInt8::forward_ref is the plain-loop ground truth; forward (oneDNN) must match it
// exactly up to the f32 dequantisation (tests/test_quant.cpp), and bench/ times both.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace eg::quant {

// Per-tensor activation quantisation: q = clamp(round(x * scale)), u8 [0, 255] when
// is_unsigned, else s8 (the range's own values map into [-127, 127]; values beyond a
// static range saturate at -128 and 127, as oneDNN's conversions do).
struct ActQuant {
  float scale = 1.f;
  bool is_unsigned = false;
};
ActQuant choose_act_quant(const Tensor& x);  // from the tensor's range (f32, CPU)

// A range of activation values, and the number of calibration batches it was observed on.
struct ActRange {
  float lo = 0.f, hi = 0.f;  // lo <= 0 <= hi
  int64_t batches = 0;
};
ActRange act_range(const Tensor& x);  // of one tensor (f32, CPU; NaN/Inf rejected)
ActQuant act_quant_from(const ActRange& r);  // u8 when lo >= 0, else s8; max(|lo|, hi) maps to the top

// The input quantisation of one layer (Note [Static activation scales]): the first
// `calibration_batches` inputs widen the range (an all-zero input does not count), later
// ones use it as it is. 0: every input its own range. One caller at a time.
class ActObserver {
 public:
  explicit ActObserver(int64_t calibration_batches) : calibration_batches_(calibration_batches) {}
  ActQuant quant(const Tensor& x);
  bool calibrated() const { return calibration_batches_ > 0 && range_.batches >= calibration_batches_; }
  const ActRange& range() const { return range_; }
  void set_range(const ActRange& r) { range_ = r; }

 private:
  int64_t calibration_batches_;
  ActRange range_;
};

class ConvInt8 {
 public:
  // w [K, C/groups, R, S] and bias [K] (or undefined) in f32, batch norm already folded.
  // act: the activation after that batch norm (its fused_act), applied to the f32 output
  // in the convolution's epilogue instead of in a pass of its own.
  ConvInt8(const Tensor& w, const Tensor& bias, const ops::Conv2dParams& p, ops::BnAct act = ops::BnAct::none);
  ~ConvInt8();
  ConvInt8(const ConvInt8&) = delete;
  ConvInt8& operator=(const ConvInt8&) = delete;

  // x [N, C, H, W] f32 on the CPU (plain, nChw16c or NHWC) -> y [N, K, P, Q] f32, NHWC
  // (Note [int8 convolution pipeline] in int8.cpp). One caller at a time.
  Tensor forward(const Tensor& x) const;  // oneDNN int8
  Tensor forward_ref(const Tensor& x) const;  // plain loops
  Tensor forward(const Tensor& x, const ActQuant& q) const;  // with a given input quantisation
  Tensor forward_ref(const Tensor& x, const ActQuant& q) const;

  const Tensor& weight_q() const { return wq_; }  // s8 [K, C/groups, R, S]
  const std::vector<float>& weight_scale() const { return w_scale_; }

 private:
  struct Prim;
  Shape out_shape(const Shape& x) const;
  Tensor wq_;
  std::vector<float> w_scale_, bias_;
  ops::Conv2dParams p_;
  ops::BnAct act_;
  Shape wshape_;
  mutable std::map<std::vector<int64_t>, std::unique_ptr<Prim>> prims_;  // per (input shape, signedness)
};

// Dynamically quantised linear layer (as PyTorch's quantize_dynamic, which the paper
// uses for Transformers): weights s8 per output feature, made once; the input [..., K]
// quantised at every call, each row (token) with the scale of its own range, u8 when the
// whole input is non-negative, else s8; oneDNN's int8 matmul accumulates in s32;
// dequantised per row and output feature with the bias added. forward_ref is the
// plain-loop ground truth.
//
// Note [Per-token activation scales]
// PyTorch's quantize_dynamic takes one scale for the whole input. For a batch of
// sentences that makes every token's quantisation depend on the rest of the batch,
// padding included: the same sentences padded to another length quantise differently
// and give Egeria another plasticity reading. With a scale per row a token is quantised
// from its own values alone (finer, too: a row's top value maps to 127 or 255), so a
// reading depends only on the real tokens (tests/test_translate.cpp pads the same batch
// two ways); the signedness is still the whole input's, which padding does not change
// (LayerNorm outputs are signed everywhere, post-ReLU rows non-negative everywhere).
class LinearInt8 {
 public:
  // w [N, K] and bias [N] (or undefined), f32.
  LinearInt8(const Tensor& w, const Tensor& bias);
  ~LinearInt8();
  LinearInt8(const LinearInt8&) = delete;
  LinearInt8& operator=(const LinearInt8&) = delete;

  // x [..., K] f32 on the CPU -> [..., N] f32, each row with its own scale. One caller at a time.
  Tensor forward(const Tensor& x) const;
  Tensor forward_ref(const Tensor& x) const;
  // The same with one given quantisation for every row.
  Tensor forward(const Tensor& x, const ActQuant& q) const;
  Tensor forward_ref(const Tensor& x, const ActQuant& q) const;

  const Tensor& weight_q() const { return wq_; }  // s8 [N, K]
  const std::vector<float>& weight_scale() const { return w_scale_; }

 private:
  struct Prim;
  // Row i of x [M, K] with scale[i] (or scale[0] for every row when it holds one).
  struct RowQuant {
    std::vector<float> scale;
    bool is_unsigned = false;
  };
  RowQuant row_quant(const Tensor& x) const;  // each row's own range
  Tensor quantize_input(const Tensor& x, const RowQuant& q) const;  // [M, K] u8/s8
  Tensor run(const Tensor& x, const RowQuant& q) const;
  Tensor run_ref(const Tensor& x, const RowQuant& q) const;
  Shape out_shape(const Tensor& x) const;
  Tensor wq_;
  std::vector<float> w_scale_, bias_;
  int64_t n_, k_;
  mutable std::map<std::vector<int64_t>, std::unique_ptr<Prim>> prims_;  // per (M, signedness)
};

}  // namespace eg::quant
