// Op cases: gemm, linear (forward/backward) and scaled dot-product attention.
#include <cmath>
#include <limits>

#include "tests/op_cases.h"

namespace eg::testing {
namespace {

Shape with_batch(int64_t batch, Shape s) {
  if (batch > 0) s.insert(s.begin(), batch);
  return s;
}

// ---------------------------------------------------------------- gemm
struct GemmCfg {
  std::string name;
  int64_t batch, m, n, k;  // batch 0: 2-D operands
  bool ta, tb;
  double alpha, beta;
  bool big;
};

void add_gemm(std::vector<OpCase>& v, const GemmCfg& g) {
  OpCase c;
  c.name = "gemm/" + g.name;
  const Shape as = with_batch(g.batch, g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k});
  const Shape bs = with_batch(g.batch, g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n});
  const Shape cs = with_batch(g.batch, {g.m, g.n});
  c.make_inputs = [=](DType dt) {
    // c: random when beta != 0; NaN when beta == 0, which must not read it. Made here,
    // with the inputs, so that a benchmark iteration times the product, not the fill.
    return Tensors{randn(as, dt, 31), randn(bs, dt, 32), g.beta != 0.0 ? randn(cs, dt, 33) : Tensor::full(cs, NAN, dt)};
  };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    Tensor out = in[2].clone();
    ops::run(ops::gemm, b, in[0], in[1], out, g.ta, g.tb, g.alpha, g.beta);
    return Tensors{out};
  };
  // d op(a) = alpha dc op(b)^T, d op(b) = alpha op(a)^T dc, written as gemms on the
  // stored operands (as autograd's matmul does). c's own gradient is not checked.
  c.backward = [=](ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    Tensor da = empty_like(in[0]), db = empty_like(in[1]);
    const Tensor& dc = dout[0];
    if (!g.ta) ops::run(ops::gemm, b, dc, in[1], da, false, !g.tb, g.alpha, 0.0);
    else ops::run(ops::gemm, b, in[1], dc, da, g.tb, true, g.alpha, 0.0);
    if (!g.tb) ops::run(ops::gemm, b, in[0], dc, db, !g.ta, false, g.alpha, 0.0);
    else ops::run(ops::gemm, b, dc, in[0], db, true, g.ta, g.alpha, 0.0);
    return Tensors{da, db, Tensor()};  // c's own gradient is not checked
  };
  c.uses = {uses(ops::gemm)};
  // Reduction length k (forward) or m, n (backward); f32 rounding grows ~sqrt(k).
  c.fwd_tol = g.big ? Tolerance{2e-4, 1e-4} : Tolerance{2e-6, 1e-5};
  c.bwd_tol = g.big ? Tolerance{5e-4, 1e-4} : Tolerance{2e-6, 1e-5};
  c.gradcheck = !g.big;
  c.bench = g.big;
  c.flops = 2.0 * double(std::max<int64_t>(g.batch, 1)) * double(g.m * g.n * g.k);
  v.push_back(c);
}

// ---------------------------------------------------------------- linear
// want: which of dx, dw, db the backward asks for (a frozen layer asks only dx; the
// first layer of a network asks no dx).
struct LinearCfg {
  std::string name;
  int64_t m, k, n;
  bool bias, want_dx, want_dw, want_db;
  bool big;
  bool accumulate = false;  // dx, dw and db added into values already there (Note [Gradient destinations])
};

void add_linear(std::vector<OpCase>& v, const LinearCfg& l) {
  OpCase c;
  c.name = "linear/" + l.name;
  c.make_inputs = [=](DType dt) {
    return Tensors{randn({l.m, l.k}, dt, 41), randn({l.n, l.k}, dt, 42, 1.0 / std::sqrt(double(l.k))),
                   l.bias ? randn({l.n}, param_dtype(dt), 43) : Tensor()};
  };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    Tensor y = Tensor::full({l.m, l.n}, NAN, in[0].dtype(), in[0].device());
    ops::run(ops::linear_fwd, b, in[0], in[1], in[2], y);
    return Tensors{y};
  };
  c.backward = [=](ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    Tensor dx = l.want_dx ? gradient_start(in[0], in[0].shape(), in[0].dtype(), l.accumulate, 46) : Tensor();
    // Under bf16 (Note [bf16 kernels]) the weight's and bias's gradients are f32, as autocast keeps them.
    const DType pt = param_dtype(in[1].dtype());
    Tensor dw = l.want_dw ? gradient_start(in[1], in[1].shape(), pt, l.accumulate, 44) : Tensor();
    Tensor db = l.bias && l.want_db ? gradient_start(in[0], {l.n}, pt, l.accumulate, 45) : Tensor();
    ops::run(ops::linear_bwd, b, dout[0], in[0], in[1], dx, dw, db, l.accumulate, l.accumulate);
    return Tensors{dx, dw, db};
  };
  c.uses = {uses(ops::linear_fwd), uses(ops::linear_bwd)};
  c.fwd_tol = l.big ? Tolerance{5e-5, 1e-4} : Tolerance{2e-6, 1e-5};
  c.bwd_tol = l.big ? Tolerance{5e-4, 1e-4} : Tolerance{2e-6, 1e-5};
  c.gradcheck = !l.big && !l.accumulate;
  c.accumulates = l.accumulate;
  c.bench = l.big;
  c.bench_backward = true;
  c.flops = 3 * 2.0 * double(l.m * l.n * l.k);  // y, dx, dw
  v.push_back(c);
}

// ---------------------------------------------------------------- attention
// lse is +inf on fully masked rows (Note [Attention masking and lse]); compare() sees
// inf - inf as NaN and lets any value through there, so the case also returns lse
// with +-inf replaced by +-1e30, which compares like any number.
Tensor lse_for_compare(const Tensor& lse) {
  Tensor l = lse.to(Device::cpu()).to(DType::f64).clone();
  double* p = l.data<double>();
  for (int64_t i = 0; i < l.numel(); ++i)
    if (std::isinf(p[i])) p[i] = p[i] > 0 ? 1e30 : -1e30;
  return l;
}

struct AttnCfg {
  std::string name;
  int64_t b, h, t, s, d;
  bool causal;
  std::vector<uint8_t> mask;  // [b, s], 1 = padding; empty: no mask
  bool big;
};

void add_attention(std::vector<OpCase>& v, const AttnCfg& a) {
  OpCase c;
  c.name = "attention/" + a.name;
  c.make_inputs = [=](DType dt) {
    Tensor mask = a.mask.empty() ? Tensor() : Tensor::from_vector(a.mask, {a.b, a.s});
    return Tensors{randn({a.b, a.h, a.t, a.d}, dt, 51), randn({a.b, a.h, a.s, a.d}, dt, 52),
                   randn({a.b, a.h, a.s, a.d}, dt, 53), mask};
  };
  const ops::AttentionParams p{a.causal, 0.0};
  c.forward = [=](ops::Backend b, const Tensors& in) {
    Tensor out = empty_like(in[0]), lse = empty_on(in[0], {a.b, a.h, a.t}, in[0].dtype());
    ops::run(ops::attention_fwd, b, in[0], in[1], in[2], in[3], out, lse, p);
    return Tensors{out, lse, lse_for_compare(lse)};
  };
  c.backward = [=](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    Tensor dq = empty_like(in[0]), dk = empty_like(in[1]), dv = empty_like(in[2]);
    ops::run(ops::attention_bwd, b, dout[0], in[0], in[1], in[2], in[3], out[0], out[1], dq, dk, dv, p);
    return Tensors{dq, dk, dv, Tensor()};
  };
  c.uses = {uses(ops::attention_fwd), uses(ops::attention_bwd)};
  c.fwd_tol = a.big ? Tolerance{1e-5, 1e-4} : Tolerance{1e-6, 1e-5};
  c.bwd_tol = a.big ? Tolerance{1e-5, 1e-4} : Tolerance{2e-6, 1e-5};
  c.gradcheck = !a.big;
  c.bench = a.big;
  c.bench_backward = true;
  c.flops = 14.0 * double(a.b * a.h * a.t * a.s * a.d);  // 2 matmuls forward, 5 backward
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  // gemm: every transpose combination, batched, alpha/beta, and the two bench sizes.
  add_gemm(v, {"nn_small", 0, 4, 5, 3, false, false, 1.0, 0.0, false});
  add_bf16_twin(v);
  add_gemm(v, {"tn_small", 0, 4, 5, 3, true, false, 1.0, 0.0, false});
  add_gemm(v, {"nt_small", 0, 4, 5, 3, false, true, 1.0, 0.0, false});
  add_gemm(v, {"tt_small", 0, 4, 5, 3, true, true, 1.0, 0.0, false});
  add_gemm(v, {"batched_nt_small", 3, 4, 2, 5, false, true, 1.0, 0.0, false});
  add_gemm(v, {"batched_tn_alpha_small", 2, 3, 4, 5, true, false, 0.5, 0.0, false});
  add_bf16_twin(v);
  add_gemm(v, {"alpha_beta_small", 0, 4, 5, 3, false, false, 0.5, 1.0, false});
  add_gemm(v, {"batched_beta_tt_small", 2, 3, 4, 2, true, true, 1.0, 0.75, false});
  add_bf16_twin(v);
  add_gemm(v, {"m128_n512_k512", 0, 128, 512, 512, false, false, 1.0, 0.0, true});
  add_bf16_twin(v);
  add_gemm(v, {"m4096_n2048_k512", 0, 4096, 2048, 512, false, false, 1.0, 0.0, true});
  add_gemm(v, {"batched_nt_b64_m128_n128_k64", 64, 128, 128, 64, false, true, 1.0, 0.0, true});
  add_bf16_twin(v);

  // linear: with and without bias, and the frozen-layer (dx only) and input-layer
  // (no dx) backward skips.
  add_linear(v, {"bias_small", 6, 5, 4, true, true, true, true, false});
  add_bf16_twin(v);
  add_linear(v, {"nobias_small", 6, 5, 4, false, true, true, true, false});
  add_linear(v, {"frozen_dx_only_small", 6, 5, 4, true, true, false, false, false});
  add_bf16_twin(v);
  add_linear(v, {"input_layer_no_dx_small", 6, 5, 4, true, false, true, true, false});
  // Rows in several slices and columns not a multiple of 32 (Note [Column sums] on CUDA).
  add_linear(v, {"bias_rows_300x5x37", 300, 5, 37, true, true, true, true, false});
  v.back().bwd_tol = {2e-5, 1e-4};  // the weight's and bias's sums over 300 rows
  // The weight's and bias's gradients added into their .grad (Note [Gradient destinations]).
  add_linear(v, {"bias_rows_300x5x37_accumulate", 300, 5, 37, true, true, true, true, false, true});
  v.back().bwd_tol = {2e-5, 1e-4};
  add_bf16_twin(v);
  add_linear(v, {"m4096_k512_n2048", 4096, 512, 2048, true, true, true, true, true});
  add_bf16_twin(v);

  // attention (B=2, H=2, T=S=5, D=4). Padding: batch 0 has padded keys, batch 1 none.
  // With causal + padding, batch 0's key 0 is padding, so its query 0 sees nothing.
  add_attention(v, {"plain_small", 2, 2, 5, 5, 4, false, {}, false});
  add_attention(v, {"cross_small", 2, 2, 3, 5, 4, false, {}, false});
  add_attention(v, {"causal_small", 2, 2, 5, 5, 4, true, {}, false});
  add_attention(v, {"padding_small", 2, 2, 5, 5, 4, false, {0, 1, 0, 0, 1, 0, 0, 0, 0, 0}, false});
  add_attention(v, {"causal_padding_small", 2, 2, 5, 5, 4, true, {1, 0, 0, 1, 0, 0, 0, 0, 0, 0}, false});
  // One query over many keys: incremental decoding's step (Note [Incremental decoding] in
  // models/transformer.cpp), unmasked as its self-attention, padded as its cross-attention.
  add_attention(v, {"one_query_small", 3, 2, 1, 7, 4, false, {}, false});
  std::vector<uint8_t> mem_pad(64 * 57, 0);
  for (int64_t b = 0; b < 64; ++b)
    for (int64_t s = 57 - b % 5; s < 57; ++s) mem_pad[size_t(b * 57 + s)] = 1;  // batch b: b % 5 padded keys
  add_attention(v, {"decode_step_b64_h8_s57_d64", 64, 8, 1, 57, 64, false, mem_pad, true});
  add_attention(v, {"b8_h8_t128_d64", 8, 8, 128, 128, 64, false, {}, true});
  std::vector<uint8_t> pad(8 * 128, 0);
  for (int64_t b = 0; b < 8; ++b)
    for (int64_t s = 128 - 9 * b; s < 128; ++s) pad[size_t(b * 128 + s)] = 1;  // batch b: 9b padded keys
  add_attention(v, {"b8_h8_t128_d64_causal_padding", 8, 8, 128, 128, 64, true, pad, true});
});

}  // namespace
}  // namespace eg::testing
