// Scaled dot-product attention, fast CPU path. Per (batch, head), in parallel over
// B*H with OpenMP: the score matrix scale*Q K^T [T, S] and the products with V, dO, K
// and Q are Eigen matmuls (single-threaded inside the parallel loop), with a
// vectorised masked softmax between them. The backward recomputes P from the saved
// lse instead of storing it. Layout: q [B, H, T, D], k/v [B, H, S, D], lse [B, H, T],
// mask u8 [B, S] (1 = padding). f32. Masking and lse follow
// Note [Attention masking and lse] in kernels/ref/attention.cpp (causal needs S == T;
// a fully masked row gives zeros and lse = +inf).
//
// Napkin math (B=8, H=8, T=S=128, D=64): forward 2 matmuls = 4*B*H*T*S*D = 0.54 GFLOP,
// backward 5 = 1.3 GFLOP; the per-head working set (Q, K, V, dO and two 128x128 score
// matrices, ~260 KB) stays in L2, so this runs near the cores' gemm rate (Eigen's
// small-matrix kernels, ~100+ GFLOP/s per core) rather than at memory speed.
// Causal masking still computes the full score matrix (at most 2x the needed work).
#include <cmath>
#include <limits>
#include <vector>

#include <Eigen/Dense>

#include "kernels/cpu/cpu.h"

namespace eg::cpu {

namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using CMap = Eigen::Map<const Mat>;
using MMap = Eigen::Map<Mat>;
using Row = Eigen::Array<float, 1, Eigen::Dynamic>;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Dims {
  int64_t b, h, t, s, d;
  float scale;
};

Dims dims_of(const Tensor& q, const Tensor& k, const ops::AttentionParams& p) {
  Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), float(p.scale)};
  if (p.scale == 0.0) d.scale = float(1.0 / std::sqrt(double(d.d)));
  EG_CHECK(!p.causal || d.t == d.s, "attention: causal masking needs T == S, got T=", d.t, " S=", d.s);
  return d;
}

// keep[s] = 1 for a real key, 0 for padding (pad: the batch's mask row, or null).
void keep_row(const uint8_t* pad, int64_t s_len, Row& keep) {
  keep.setOnes(s_len);
  if (!pad) return;
  for (int64_t s = 0; s < s_len; ++s) keep[s] = pad[s] ? 0.f : 1.f;
}

// In place on a row of scores: the softmax weights over the first `len` keys with
// keep == 1 (others 0). Returns the row's log-sum-exp, +inf when nothing is visible.
float masked_softmax(float* row, int64_t len, int64_t s_len, const Row& keep) {
  Eigen::Map<Row> r(row, s_len);
  auto head = r.head(len);
  auto kh = keep.head(len);
  const float mx = (kh > 0.f).select(head, -kInf).maxCoeff();
  if (!(mx > -kInf)) {
    r.setZero();
    return kInf;
  }
  // Padded scores are moved to -inf before exp so they cannot overflow; the keep
  // factor then makes their weight exactly zero.
  head = (kh > 0.f).select(head - mx, -kInf).exp() * kh;
  r.tail(s_len - len).setZero();
  const float sum = head.sum();
  head /= sum;
  return mx + std::log(sum);
}

}  // namespace

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask, Tensor& out,
                   Tensor& lse, const ops::AttentionParams& p) {
  const Dims d = dims_of(q, k, p);
  const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>();
  float* op = out.data<float>();
  float* lp = lse.defined() ? lse.data<float>() : nullptr;
  const uint8_t* pad = key_padding_mask.defined() ? key_padding_mask.data<uint8_t>() : nullptr;
#pragma omp parallel
  {
    Mat sc(d.t, d.s);
    Row keep;
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < d.b * d.h; ++bh) {
      CMap Q(qp + bh * d.t * d.d, d.t, d.d), K(kp + bh * d.s * d.d, d.s, d.d), V(vp + bh * d.s * d.d, d.s, d.d);
      MMap O(op + bh * d.t * d.d, d.t, d.d);
      keep_row(pad ? pad + (bh / d.h) * d.s : nullptr, d.s, keep);
      sc.noalias() = d.scale * (Q * K.transpose());
      for (int64_t t = 0; t < d.t; ++t) {
        const float l = masked_softmax(sc.data() + t * d.s, p.causal ? t + 1 : d.s, d.s, keep);
        if (lp) lp[bh * d.t + t] = l;
      }
      O.noalias() = sc * V;
    }
  }
}

// P = exp(scores - lse) on visible keys; dV = P^T dO; dP = dO V^T;
// dS = P * (dP - rowsum(P * dP)); dQ = scale dS K; dK = scale dS^T Q.
void attention_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& key_padding_mask, const Tensor& /*out*/, const Tensor& lse, Tensor& dq, Tensor& dk,
                   Tensor& dv, const ops::AttentionParams& p) {
  const Dims d = dims_of(q, k, p);
  const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>();
  const float *dop = dout.data<float>(), *lp = lse.data<float>();
  float* dqp = dq.defined() ? dq.data<float>() : nullptr;
  float* dkp = dk.defined() ? dk.data<float>() : nullptr;
  float* dvp = dv.defined() ? dv.data<float>() : nullptr;
  const uint8_t* pad = key_padding_mask.defined() ? key_padding_mask.data<uint8_t>() : nullptr;
#pragma omp parallel
  {
    Mat pm(d.t, d.s), dp(d.t, d.s);
    Row keep;
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < d.b * d.h; ++bh) {
      CMap Q(qp + bh * d.t * d.d, d.t, d.d), K(kp + bh * d.s * d.d, d.s, d.d), V(vp + bh * d.s * d.d, d.s, d.d);
      CMap dO(dop + bh * d.t * d.d, d.t, d.d);
      keep_row(pad ? pad + (bh / d.h) * d.s : nullptr, d.s, keep);
      pm.noalias() = d.scale * (Q * K.transpose());
      for (int64_t t = 0; t < d.t; ++t) {
        Eigen::Map<Row> r(pm.data() + t * d.s, d.s);
        const float l = lp[bh * d.t + t];
        const int64_t len = p.causal ? t + 1 : d.s;
        if (!std::isfinite(l)) {
          r.setZero();
          continue;
        }
        auto kh = keep.head(len);
        r.head(len) = (kh > 0.f).select(r.head(len) - l, -kInf).exp() * kh;
        r.tail(d.s - len).setZero();
      }
      if (dvp) MMap(dvp + bh * d.s * d.d, d.s, d.d).noalias() = pm.transpose() * dO;
      if (!dqp && !dkp) continue;
      dp.noalias() = dO * V.transpose();
      for (int64_t t = 0; t < d.t; ++t) {
        auto pr = pm.row(t).array();
        auto dr = dp.row(t).array();
        const float rowsum = (pr * dr).sum();
        dr = pr * (dr - rowsum) * d.scale;  // dS, scale folded in
      }
      if (dqp) MMap(dqp + bh * d.t * d.d, d.t, d.d).noalias() = dp * K;
      if (dkp) MMap(dkp + bh * d.s * d.d, d.s, d.d).noalias() = dp.transpose() * Q;
    }
  }
}

}  // namespace eg::cpu
